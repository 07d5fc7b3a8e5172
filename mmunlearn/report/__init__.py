"""Results that can be traced: a run's JSON recorded with its command, date, commit and machine, and the
Markdown tables of the docs generated from those records (``mmunlearn report``).

A record (``docs/results/<name>.json``) holds ``columns`` (``[header, key]`` pairs), ``rows`` (dicts) and
where they came from. A docs page marks each generated table::

    <!-- results: smollm2_tofu -->
    | method | forget quality | ... |
    <!-- /results -->

:func:`update_pages` rewrites every marked block from its record; :func:`stale_blocks` lists the blocks
whose text differs from what their record gives (a test runs it over ``docs/``, so a page and its JSON
cannot disagree). Every table is written by :func:`table`; every figure by :mod:`mmunlearn.report.figures`.

>>> rec = {"columns": [["method", "method"], ["forget quality", "fq"]], "rows": [{"method": "t3", "fq": 0.081}]}
>>> print(render(rec))
| method | forget quality |
|---|---:|
| t3 | 0.0810 |
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmunlearn.files.atomic import write_text_atomic

BLOCK = re.compile(r"(<!-- results: (?P<name>[A-Za-z0-9_.-]+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S)


#: the longest header or cell a table takes (a figure, a method name, a short note: not a file's contents)
MAX_CELL = 10_000
#: a marker of a generated block: a cell holding one would split the block on the next update
_MARKERS = ("<!-- results", "<!-- /results")
#: terminal control: CSI and OSC escape sequences, then any other C0/C1 control character but newline and tab
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


#: what can start markup in a page: ``<`` before a letter, ``/``, ``!`` or ``?`` (a tag, comment or declaration)
#: and ``&`` before a name or ``#`` (an entity); a lone ``<=``, ``->`` or ``>= 50x`` is plain text and stays so
_TAG, _ENTITY = re.compile(r"<(?=[A-Za-z/!?])"), re.compile(r"&(?=[A-Za-z0-9#])")


def cell(text: str, where: str = "a cell") -> str:
    """``text`` safe in a Markdown table that the docs site renders as HTML, and on a terminal: terminal escape
    sequences stripped, a ``<`` or ``&`` that could start a tag or entity written as one, ``|`` escaped, line
    breaks as ``<br>``. A results
    marker is refused (ValueError naming ``where``): it would split the page's generated block."""
    if len(text) > MAX_CELL:
        raise ValueError(f"{where} holds {len(text):,} characters, more than the {MAX_CELL:,} a table cell may hold")
    if any(m in text for m in _MARKERS):
        raise ValueError(f"{where} holds a results marker ({text[:60]!r}): refused, it would split the page's block")
    text = _ESCAPES.sub("", text).replace("\t", " ")
    text = _ENTITY.sub("&amp;", text)
    text = _TAG.sub("&lt;", text).replace("|", "\\|")
    return "<br>".join(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"))


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def names(items: Sequence[str]) -> str:
    """Names (layers, mostly) as one short cell: consecutive numbered names with the same stem as a range
    (``text.layers.0`` ... ``text.layers.29`` -> ``text.layers.0-29``), in their given order, comma-separated."""
    parts: list[list] = []  # [stem, first, last] of a numbered run, or [name] of any other
    for item in items:
        m = _NUMBERED.match(item)
        if m is None or (len(m.group(2)) > 1 and m.group(2).startswith("0")):  # "07" is kept as written
            parts.append([item])
            continue
        stem, number = m.group(1), int(m.group(2))
        if parts and len(parts[-1]) == 3 and parts[-1][0] == stem and parts[-1][2] + 1 == number:
            parts[-1][2] = number
        else:
            parts.append([stem, number, number])
    return ", ".join(
        p[0] if len(p) == 1 else f"{p[0]}{p[1]}" if p[1] == p[2] else f"{p[0]}{p[1]}-{p[2]}" for p in parts
    )


def fmt(value: Any, percent: bool = False) -> str:
    """A table cell (the one formatter of every table the toolkit writes): n/a for None, yes/NO for booleans, a list
    of names as :func:`names` (numbered runs as ranges), a pair as ``[low, high]``, a fraction in % with one decimal
    when ``percent``, otherwise 4 decimals (scientific when tiny or huge, one decimal from 10 up)."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return names(value)
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return f"[{fmt(value[0], percent)}, {fmt(value[1], percent)}]"
    if isinstance(value, float):
        if value != value:
            return "nan"
        if percent:
            return f"{100 * value:.1f}"
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e4):
            return f"{value:.2e}"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Sequence[Any]], missing: str | None = None) -> str:
    """The one Markdown table writer: ``columns`` are ``(header, key)`` or ``(header, key, percent)`` specs, the
    first column left-aligned and the others right-aligned; each cell is :func:`fmt` of the row's value (``missing``
    where a row lacks the key, when given; else as None) and every header and cell goes through :func:`cell`."""
    specs = [(str(c[0]), c[1], bool(c[2]) if len(c) > 2 else False) for c in columns]
    if not specs:
        raise ValueError("a table needs at least one column")
    head = "| " + " | ".join(cell(h, f"column header {h[:40]!r}") for h, _, _ in specs) + " |"
    sep = "|---|" + "---:|" * (len(specs) - 1)
    body = [
        "| "
        + " | ".join(
            cell(missing if missing is not None and k not in r else fmt(r.get(k), pct), f"row {i} column {k!r}")
            for _, k, pct in specs
        )
        + " |"
        for i, r in enumerate(rows)
    ]
    return "\n".join([head, sep, *body])


def render(record: Mapping[str, Any]) -> str:
    """The Markdown table of a record (:func:`table` of its ``columns`` and ``rows``)."""
    rows = record.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
        raise ValueError("a results record needs 'rows': a list of objects")
    return table(rows, _columns(record))


def _columns(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    columns = record.get("columns")
    if columns is None and record.get("rows"):
        columns = [[k, k] for k in record["rows"][0]]
    if (
        not isinstance(columns, list)
        or not columns
        or not all(isinstance(c, (list, tuple)) and len(c) == 2 and all(isinstance(x, str) for x in c) for c in columns)
    ):
        raise ValueError("a results record needs 'columns': a list of [header, key] pairs")
    return [(h, k) for h, k in columns]


def machine_facts() -> dict[str, Any]:
    """Cores, load average, CPU flags that matter here (bf16), Python and torch versions."""
    facts: dict[str, Any] = {
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        facts["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
        facts["avx512_bf16"] = "avx512_bf16" in flags.split()
        facts["amx"] = "amx_bf16" in flags.split()
    except OSError:
        pass
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return facts


#: the checkout this package runs from (the commit a record names is the code's, not the working directory's)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: git run with no file-system monitor (``core.fsmonitor`` names a program git would run) and no optional locks
GIT = ("git", "-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false")


def git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    """The checked-out commit (short) with ``+dirty`` when the tree has changes; None outside a repository.
    ``cwd`` None: the repository of the package itself (:data:`PACKAGE_ROOT`, None when it is installed, not a
    checkout), never the current directory, whose repository's configuration could run a program."""
    if cwd is None:
        if not (PACKAGE_ROOT / ".git").exists():
            return None
        cwd = PACKAGE_ROOT
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        head = subprocess.run(
            [*GIT, "rev-parse", "--short", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
            env=env,
        ).stdout.strip()
        dirty = subprocess.run(
            [*GIT, "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def load_source(path: str | os.PathLike) -> dict[str, Any]:
    """A run's JSON: a file, or a run folder holding ``compare.json`` / ``run.json`` (the first found)."""
    path = Path(path)
    if path.is_dir():
        found = next((path / n for n in ("compare.json", "run.json", "results.json") if (path / n).is_file()), None)
        if found is None:
            raise FileNotFoundError(f"{path}: no compare.json, run.json or results.json in this folder")
        path = found
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a run's results") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def make_record(
    source: Mapping[str, Any],
    *,
    name: str,
    command: str,
    title: str = "",
    columns: Sequence[Sequence[str]] | None = None,
    rows_key: str = "rows",
    date: str | None = None,
    commit: str | None = None,
    config: str | None = None,
) -> dict[str, Any]:
    """A record of ``source`` (a run's JSON: its ``rows_key`` list, and its ``columns`` unless given); ``config``: the
    shipped recipe config (``benchmark/name``) whose ``--config`` command has the run's settings."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"record name {name!r}: use letters, digits, '.', '_' and '-' only")
    rows = source.get(rows_key)
    if not isinstance(rows, list) or not rows or not all(isinstance(r, Mapping) for r in rows):
        raise ValueError(f"the run's JSON has no '{rows_key}': a list of rows (objects of column: value)")
    record = {
        "name": name,
        "title": title,
        "command": command,
        **({"config": config} if config else {}),
        "date": date or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit if commit is not None else git_commit(),
        # the run's own machine facts when it wrote them (load while it ran), else those at recording
        "machine": dict(source.get("machine") or machine_facts()),
        "columns": [list(c) for c in (columns or source.get("columns") or [[k, k] for k in rows[0]])],
        "rows": portable(rows),
        "context": portable(source.get("context", {})),
    }
    render(record)  # refuse a record that cannot be rendered
    return record


def portable(value: Any, cwd: str | os.PathLike | None = None, home: str | os.PathLike | None = None) -> Any:
    """``value`` (JSON-like) with this machine's paths made portable: a path under the working folder relative to
    it, one under the home folder as ``~/...`` (a record names no absolute path of the machine it was made on)."""
    cwd = os.path.abspath(cwd if cwd is not None else os.getcwd())
    home = os.path.abspath(home if home is not None else os.path.expanduser("~"))
    if isinstance(value, str):
        for root, shown in sorted(((cwd, "."), (home, "~")), key=lambda r: -len(r[0])):  # the nearer root first
            if value == root or value.startswith(root + os.sep):
                rest = value[len(root) :].lstrip(os.sep)
                return rest if shown == "." and rest else f"{shown}/{rest}" if rest else shown
        return value
    if isinstance(value, Mapping):
        return {k: portable(v, cwd, home) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, cwd, home) for v in value]
    return value


def write_record(record: Mapping[str, Any], folder: str | os.PathLike) -> Path:
    path = Path(folder) / f"{record['name']}.json"
    write_text_atomic(path, json.dumps(record, indent=2, default=str) + "\n")
    return path


def _blocks(text: str, results: Path) -> list[tuple[re.Match, str]]:
    out = []
    for m in BLOCK.finditer(text):
        path = results / f"{m.group('name')}.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"a docs page names the results record {m.group('name')!r}, but {path} does not exist"
            )
        out.append((m, render(json.loads(path.read_text())) + "\n"))
    return out


def stale_blocks(pages: Sequence[str | os.PathLike], results: str | os.PathLike) -> list[str]:
    """``page: record`` for every marked table whose text is not what its record renders."""
    stale = []
    for page in pages:
        text = Path(page).read_text()
        stale += [f"{page}: {m.group('name')}" for m, table in _blocks(text, Path(results)) if m.group("body") != table]
    return stale


def update_pages(pages: Sequence[str | os.PathLike], results: str | os.PathLike) -> list[str]:
    """Rewrite every marked table from its record; returns the pages changed."""
    changed = []
    for page in pages:
        text = Path(page).read_text()
        new = text
        for m, table in reversed(_blocks(text, Path(results))):
            new = new[: m.start("body")] + table + new[m.end("body") :]
        if new != text:
            write_text_atomic(Path(page), new)
            changed.append(str(page))
    return changed
