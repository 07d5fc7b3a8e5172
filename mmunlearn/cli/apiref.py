"""The API reference page of the docs site, written from the public functions' signatures and docstrings and from
the method and kind registries at every build, so it cannot drift from the code: mkdocs.yml names this module as a
hook (:func:`on_files` adds the page ``api.md``; tests/docs/test_docs.py builds the site and reads it back), and
``python -m mmunlearn.cli.apiref --out FILE`` writes the same Markdown to a file.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.kinds import kinds
from mmunlearn.methods import REGISTRY

#: (section, [(the name users call it by, module, attribute)]) of the public functions, in page order.
FUNCTIONS: tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...] = (
    (
        "Unlearning a model you bring",
        (
            ("mmunlearn.unlearn", "mmunlearn.api.unlearn", "unlearn"),
            ("mmunlearn.load", "mmunlearn.api.load", "load"),
            ("mmunlearn.api.unlearn.prepare_retain", "mmunlearn.api.unlearn", "prepare_retain"),
            ("mmunlearn.api.unlearn.model_kind", "mmunlearn.api.unlearn", "model_kind"),
            ("mmunlearn.api.unlearn.default_method", "mmunlearn.api.unlearn", "default_method"),
            ("mmunlearn.api.unlearn.load_model", "mmunlearn.api.unlearn", "load_model"),
        ),
    ),
    (
        "Restoring and releasing an output",
        (
            ("mmunlearn.api.restore.restore_folder (mmunlearn restore)", "mmunlearn.api.restore", "restore_folder"),
            (
                "mmunlearn.files.undo_store.release_problems (mmunlearn check-release)",
                "mmunlearn.files.undo_store",
                "release_problems",
            ),
        ),
    ),
    (
        "Erasing task matrices from any module",
        (("mmunlearn.erase", "mmunlearn.erase", "erase"), ("mmunlearn.restore", "mmunlearn.erase", "restore")),
    ),
    (
        "The default rules",
        (
            ("mmunlearn.api.rules.text_rule", "mmunlearn.api.rules", "text_rule"),
            ("mmunlearn.api.rules.speaker_rule", "mmunlearn.api.rules", "speaker_rule"),
        ),
    ),
    (
        "The registries",
        (
            ("mmunlearn.methods.names", "mmunlearn.methods", "names"),
            ("mmunlearn.methods.get", "mmunlearn.methods", "get"),
            ("mmunlearn.kinds.kinds", "mmunlearn.kinds", "kinds"),
            ("mmunlearn.kinds.get_kind", "mmunlearn.kinds", "get_kind"),
            ("mmunlearn.kinds.kind_of", "mmunlearn.kinds", "kind_of"),
        ),
    ),
)
#: The page's path in the site.
PAGE = "api.md"


def _annotation(value: object) -> str:
    return value if isinstance(value, str) else inspect.formatannotation(value)


def signature(obj: object, name: str) -> str:
    """``name(param: annotation = default, ...) -> return``, one parameter a line (annotations as written)."""
    sig = inspect.signature(obj)
    params, star = [], False
    for p in sig.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            params.append("*")
        star = star or p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {p.default!r}"
        params.append(text)
    ret = f" -> {_annotation(sig.return_annotation)}" if sig.return_annotation is not sig.empty else ""
    return f"{name}(\n" + "".join(f"    {p},\n" for p in params) + f"){ret}"


def _function(title: str, module: str, name: str) -> list[str]:
    obj = getattr(importlib.import_module(module), name)
    doc = inspect.cleandoc(obj.__doc__ or "(no docstring)")
    return [f"### `{title}`", "", "```python", signature(obj, name), "```", "", "```text", doc, "```", ""]


def _methods() -> list[str]:
    out = [
        "## Registered methods",
        "",
        "Each method: the model kinds it applies to, what it works from, whether it edits weights, its settings "
        "(the config fields a call's keyword arguments override; `mmunlearn methods` prints the same).",
        "",
    ]
    for m in REGISTRY.values():
        out += [
            f"### `{m.name}`",
            "",
            m.help,
            "",
            f"- kinds: {', '.join(m.kinds)}; needs: {', '.join(m.needs) or 'nothing'}; "
            f"{'edits weights' if m.edits_weights else 'keeps the weights (a head used at decoding)'}",
        ]
        for f in fields(m.config):
            default = m.defaults.get(f.name, f.default if f.default is not MISSING else "(see presets)")
            out.append(f"- `{f.name}` = `{default!r}`: {f.metadata.get('help', '')}")
        out.append("")
    return out


def _kinds() -> list[str]:
    out = [
        "## Registered model kinds",
        "",
        "`mmunlearn.kinds.kind_of(folder)` picks the first kind whose detector accepts the folder, in this order.",
        "",
    ]
    for k in kinds():
        caps = [c for c in ("is_classifier", "takes_audio", "has_batchnorm", "train_in_eval_mode") if getattr(k, c)]
        out += [
            f"### `{k.name}`",
            "",
            k.description,
            "",
            f"- sizes: {', '.join(k.sizes)} (default {k.default_size}); capabilities: {', '.join(caps) or 'none'}"
            + (f"; method presets from `{k.presets_from}`" if k.presets_from else ""),
            "",
        ]
    return out


def render() -> str:
    """The page's Markdown."""
    lines = [
        "# API reference",
        "",
        "Generated from the code at each build of this site (`mmunlearn/cli/apiref.py`): each public function's "
        "signature and docstring, then the registered methods and model kinds.",
        "",
    ]
    for section, entries in FUNCTIONS:
        lines += [f"## {section}", ""]
        for entry in entries:
            lines += _function(*entry)
    lines += _methods() + _kinds()
    return "\n".join(lines).rstrip() + "\n"


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the generated page to the site's files."""
    from mkdocs.structure.files import File  # deferred: mkdocs is a docs-build tool, not a dependency of the library

    files.append(File.generated(config, PAGE, content=render()))
    return files


def main(argv: list[str] | None = None) -> Path:
    """Write the page's Markdown to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="File to write the Markdown to (replaced).")
    args = parser.parse_args(argv)
    write_text_atomic(args.out, render())
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
