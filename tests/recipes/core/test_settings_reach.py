"""Every setting of every recipe command reaches that command's run or is refused (issue 48: "a user's setting must do
what it says or be refused"). No model work: for each command made from a config class
(:data:`recipes.recipe_cli.CONFIG_COMMANDS`, filled as the recipe modules of the ``mmunlearn.recipes`` entry points are
imported) the test follows, in the source, the functions its body calls and the config's methods and properties they
use, collects the fields read on the way (``cfg.field``, ``self.field`` in the config's methods, ``getattr`` with a
name or over a module constant), and sets every other field it takes to a value other than its default: the config
must refuse it with an error naming the field. A field that nothing on a command's path reads and that the config does
not refuse fails here. ``__post_init__`` (the checks) does not count as reading a setting.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap
import types
import typing
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from recipes.recipe_cli import CONFIG_COMMANDS, ConfigCommand
from recipes.recipe_config import ConfigError, build_config, field_types

for _group in ("mmunlearn.recipes", "mmunlearn.bench"):  # the recipes register their commands as they are read
    for _entry in entry_points(group=_group):
        _entry.load()
#: The recipes' config commands (not those other tests make, which register too).
COMMANDS = [c for c in CONFIG_COMMANDS if c.body.__module__.startswith("recipes.")]

#: A command whose body branches on a setting: one variant per branch, each with the settings that choose it and
#: the functions of the other branches (not followed). The variants of voxceleb2 are its two model paths, those of
#: ``bench requests`` its two datasets.
VARIANTS: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "VoxCelebConfig": {
        "classifier": ((), ("recipes.voxceleb2.cli._unlearn_speech_llm",)),
        "speech-llm": (("model=speech-llm",), ("recipes.voxceleb2.cli._unlearn",)),
    },
    "RequestsConfig": {
        "speaker": ((), ("recipes.requests.tofu.run_tofu",)),
        "tofu": (("dataset=tofu",), ("recipes.requests.speaker.run_speaker",)),
    },
}
#: Values other than the default for fields whose type alone does not say what is valid.
SAMPLES: dict[str, Any] = {
    "method": "grad_diff",
    "methods": ("grad_ascent",),
    "data": "synthetic:n_authors=8",
    "preset": "tiny",
    "base": "base",
    "max_new_tokens": "auto",
    "extract": "gradient",
    "audit_relearn_on": "retain",
    "audit_attacks": "probe",
    "ft_precision": "bf16",
    "device": "cpu",
    "forget_split": "forget05",
    "metrics": "forget",
    "precision": "bf16",
    "langs": "en,fr",
    "forget_lang": "en,fr",
    "eval_langs": "en",
    "retain_langs": "all",
    "train_text": "files",
    "llm": "tiny",
    "where": "audio",
    "keep_task": "transcript",
    "reference": "runs/reference",
    "retrained": "runs/retrained",
    "layer_rule": "top",
    "scope": "head",
    "sweep_ranks": (1, 3),
    "method_options": {"grad_ascent": {"lr": 0.5}},
    "model": "hf-audio",
    "dataset": "tofu",
}


def _sample(name: str, tp: Any, default: Any) -> Any:
    """A valid value of the field other than its default."""
    if name in SAMPLES:
        return SAMPLES[name]
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    if args[0] is bool:
        return not default
    if args[0] is int:
        return (default or 0) + 2
    if args[0] is float:
        return default / 2 if default else 0.25
    if args[0] is Path:
        return Path("runs/elsewhere")
    raise AssertionError(f"no sample value for the setting {name!r} ({tp}): add one to SAMPLES")


def _resolve(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _loop_sources(tree: ast.AST) -> dict[str, ast.expr]:
    """Each loop variable of ``tree`` (``for k in X`` or a comprehension) with the expression it runs over."""
    out: dict[str, ast.expr] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            out[node.target.id] = node.iter
    return out


def _strings(expr: ast.expr, scope: dict[str, Any]) -> set[str]:
    """The names a ``getattr`` runs over: a tuple of string literals, or a module constant of strings."""
    try:
        value = ast.literal_eval(expr)
    except ValueError:
        value = scope.get(expr.id) if isinstance(expr, ast.Name) else None
    return {v for v in value if isinstance(v, str)} if isinstance(value, (tuple, list, set, dict)) else set()


def reads(cls: type, roots: list[Any], blocked: set[Any]) -> tuple[set[str], set[Any]]:
    """(the fields of ``cls`` read on the paths from ``roots``, the functions followed): module-level functions of the
    ``recipes`` package by name or ``module.name``, and the config's methods and properties by ``cfg.``/``self.``."""
    fields = {f.name for f in dataclasses.fields(cls)}
    found: set[str] = set()
    seen: set[Any] = set()
    todo = list(roots)
    while todo:
        fn = todo.pop()
        if fn in seen or fn in blocked:
            continue
        seen.add(fn)
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
        tree.decorator_list = []  # a command's decorator is not its body
        scope = fn.__globals__
        loops = _loop_sources(tree)
        # the config: a parameter ``cfg``, and ``self`` in the config's own methods
        names = {"self"} if fn.__qualname__.split(".")[0] in {c.__name__ for c in cls.__mro__} else set()
        names |= {"cfg"} & set(inspect.signature(fn).parameters)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
                if node.attr in fields:
                    found.add(node.attr)
                    continue
                member = inspect.getattr_static(cls, node.attr, None)
                if isinstance(member, property):
                    todo.append(member.fget)
                elif isinstance(member, types.FunctionType):
                    todo.append(member)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id in names
            ):
                key = node.args[1]
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    found.add(key.value)
                elif isinstance(key, ast.Name) and key.id in loops:
                    found |= _strings(loops[key.id], scope) & fields
            elif isinstance(node, ast.Name):
                target = scope.get(node.id)
                if isinstance(target, types.FunctionType) and target.__module__.startswith("recipes."):
                    todo.append(target)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                module = scope.get(node.value.id)
                if isinstance(module, types.ModuleType) and module.__name__.startswith("recipes."):
                    target = getattr(module, node.attr, None)
                    if isinstance(target, types.FunctionType):
                        todo.append(target)
    return found & fields, seen


def _variants(command: ConfigCommand) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    return VARIANTS.get(command.cls.__name__, {"": ((), ())})


CASES = [(c, v) for c in COMMANDS for v in _variants(c)]


def _case_id(case: tuple[ConfigCommand, str]) -> str:
    command, variant = case
    return f"{command.body.__module__.split('.')[1]}-{command.name}" + (f"-{variant}" if variant else "")


def test_every_recipe_config_is_walked():
    """Each recipe's commands are here, and every config dataclass of ``recipes/`` is the config of a command or a
    layer of one."""
    assert {_case_id((c, "")).split("-")[0] for c in COMMANDS} >= {"tofu", "ctofu", "voxceleb2", "requests"}
    used = {k for c in COMMANDS for k in c.cls.__mro__}
    root = Path(__file__).resolve().parents[3] / "recipes"
    for path in sorted([*root.glob("*/config.py"), *root.glob("*_config.py")]):
        module = importlib.import_module(".".join(path.relative_to(root.parent).with_suffix("").parts))
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__:
                assert obj in used, f"{path.relative_to(root)}: {obj.__name__} is the config of no command"
    for name, variants in VARIANTS.items():  # a variant's blocked function is on the command's path
        command = next(c for c in COMMANDS if c.cls.__name__ == name)
        _, followed = reads(command.cls, [command.body], set())
        for _, blocked in variants.values():
            assert {_resolve(b) for b in blocked} <= followed, blocked


def test_the_voxceleb2_variants_cover_every_model():
    from recipes.voxceleb2.settings import model_kind, models

    for model in models():
        assert ("classifier" if model_kind(model).is_classifier else "speech-llm") in VARIANTS["VoxCelebConfig"]


def _silent(command: ConfigCommand, variant: str) -> list[str]:
    """The settings ``command`` takes that nothing on its path (``variant``'s) reads and that the config does not
    refuse when set to other than their default."""
    chooses, blocked = _variants(command)[variant]
    found, _ = reads(command.cls, [command.body], {_resolve(b) for b in blocked})
    types_ = field_types(command.cls)
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(command.cls)
    }
    build = dict(allowed=command.keys, kind=command.kind, overrides=list(chooses))
    build_config(command.cls, **build)  # the variant's own settings are valid
    silent = []
    for key in command.keys:
        if key in found or any(c.startswith(f"{key}=") for c in chooses):
            continue
        try:
            build_config(command.cls, given={key: _sample(key, types_[key], defaults[key])}, **build)
        except ConfigError as e:
            assert e.key == key, f"{key}: refused under another name ({e.key}): {e}"
            assert "\n" not in str(e), str(e)
            continue
        silent.append(key)
    return silent


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_every_setting_reaches_the_run_or_is_refused(case):
    silent = _silent(*case)
    assert not silent, (
        f"{_case_id(case)}: the settings {silent} reach nothing on this command's path and are not "
        "refused: pass them to the run or refuse a value other than the default in the config's check"
    )


def test_a_setting_that_nothing_reads_fails_the_walk():
    """The walk itself: a field added to a config that no function on the path reads is caught, on every command of
    that config; the five settings the speech-LLM path once ignored are read on it."""
    from mmunlearn.config import opt
    from recipes.tofu.config import TofuConfig
    from recipes.voxceleb2.config import VoxCelebConfig

    @dataclasses.dataclass(frozen=True)
    class Added(TofuConfig):
        forgotten_knob: int | None = opt(None, "A setting nothing reads.")

    tofu_run = next(c for c in COMMANDS if c.cls is TofuConfig and c.name == "run")
    added = ConfigCommand(Added, "run", (*tofu_run.keys, "forgotten_knob"), tofu_run.kind, tofu_run.body)
    assert _silent(added, "") == ["forgotten_knob"]
    speaker = next(c for c in COMMANDS if c.cls is VoxCelebConfig and c.name == "speaker")
    found, _ = reads(VoxCelebConfig, [speaker.body], {_resolve("recipes.voxceleb2.cli._unlearn")})
    assert {"retain_bound", "lr", "epochs", "extract", "resume"} <= found
    # without the function that runs the speech-LLM level from the config, they would reach nothing there
    found, _ = reads(
        VoxCelebConfig,
        [speaker.body],
        {_resolve("recipes.voxceleb2.cli._unlearn"), _resolve("recipes.voxceleb2.speech_llm.run_level")},
    )
    assert not {"retain_bound", "lr", "epochs", "extract", "resume"} & found


def test_each_sample_is_a_value_some_command_takes():
    """The samples above are valid where their field is read (so a refusal above is about the path, not the value)."""
    read_somewhere: dict[str, list] = {}
    for command, variant in CASES:
        chooses, blocked = _variants(command)[variant]
        found, _ = reads(command.cls, [command.body], {_resolve(b) for b in blocked})
        for key in found & set(command.keys):
            read_somewhere.setdefault(key, []).append((command, chooses))
    for command in COMMANDS:
        types_ = field_types(command.cls)
        defaults = {
            f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(command.cls)
        }
        for key in command.keys:
            assert key in read_somewhere, f"{command.cls.__name__}.{key} is read by no command"
            errors = []
            for where, chooses in read_somewhere[key]:
                if where.cls is not command.cls:
                    continue
                try:
                    build_config(
                        where.cls,
                        allowed=where.keys,
                        kind=where.kind,
                        overrides=list(chooses),
                        given={key: _sample(key, types_[key], defaults[key])},
                    )
                    break
                except ConfigError as e:
                    errors.append(str(e))
            else:
                pytest.fail(f"{command.cls.__name__}.{key}: the sample is refused wherever it is read: {errors}")


def _commands(app: Any, prefix: str = ""):
    for command in app.registered_commands:
        yield prefix + (command.name or command.callback.__name__), command.callback
    for group in app.registered_groups:
        yield from _commands(group.typer_instance, f"{prefix}{group.name} ")


def test_every_option_of_every_other_command_is_used_by_its_body():
    """The commands not made from a config (``erase``, ``bench requests``, ``tofu finetune``, ...): each of their
    parameters is used in the command's body (passed on or read), none declared and dropped."""
    from mmunlearn.cli import app

    made = {(c.body.__module__, c.body.__name__) for c in CONFIG_COMMANDS}
    walked = 0
    for name, callback in _commands(app):
        if (callback.__module__, callback.__name__) in made:
            continue
        node = ast.parse(textwrap.dedent(inspect.getsource(callback))).body[0]
        params = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
        used = {n.id for statement in node.body for n in ast.walk(statement) if isinstance(n, ast.Name)}
        assert not [p for p in params if p not in used], f"`mmunlearn {name}`: options its body never uses"
        walked += 1
    assert walked >= 20
