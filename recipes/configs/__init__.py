"""Shipped recipe configs: ``recipes/configs/<benchmark>/<name>.yaml``, the documented presets as YAML files.

Each file holds a config dataclass's fields (:class:`recipes.tofu.config.TofuConfig`,
:class:`recipes.ctofu.config.CTofuConfig`, :class:`recipes.voxceleb2.config.VoxCelebConfig`,
:class:`recipes.requests.config.RequestsConfig` for ``bench requests``) with the values of a documented command; its
first comment line says what it runs and which doc section it reproduces. A recipe's ``--config`` takes a file path
or a shipped name (``tofu/smollm2``; :func:`resolve`), and ``mmunlearn <benchmark> configs`` lists them
(:func:`shipped`, :func:`describe`). The files are package data (pyproject.toml), so an installed copy has them.
"""

from __future__ import annotations

from pathlib import Path

from recipes.recipe_config import ConfigError

#: The folder of the shipped configs (one sub-folder per benchmark).
ROOT = Path(__file__).resolve().parent
SUFFIX = ".yaml"


def shipped(benchmark: str | None = None) -> dict[str, Path]:
    """Every shipped config as ``{"<benchmark>/<name>": file}``, sorted by name; only ``benchmark``'s when given."""
    found = {
        f"{path.parent.name}/{path.stem}": path
        for path in ROOT.glob(f"*/*{SUFFIX}")
        if path.is_file() and not path.name.startswith(".")
    }
    return {name: found[name] for name in sorted(found) if benchmark is None or name.startswith(f"{benchmark}/")}


def describe(path: Path) -> str:
    """The first comment line of a config file, without its ``#`` ('' when the file has none)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("#"):
            return line.strip().lstrip("#").strip()
    return ""


def _listing(benchmark: str | None) -> str:
    names = list(shipped(benchmark))
    what = f"shipped {benchmark} configs" if benchmark else "shipped configs"
    return f"{what}: {', '.join(names) if names else 'none'}"


def resolve(spec: str | Path, benchmark: str | None = None) -> Path:
    """The file of a ``--config`` value: ``spec`` itself when that path exists (a file path wins), else the shipped
    config it names (``tofu/smollm2``; ``smollm2`` within ``benchmark``; a trailing ``.yaml`` is allowed).

    A :class:`~recipes.recipe_config.ConfigError` (key ``config``) in one line, listing ``benchmark``'s shipped
    names, for a value that is neither, or for another benchmark's shipped config.
    """
    path = Path(spec)
    if path.exists() or path.is_symlink():
        return path
    name = str(spec).replace("\\", "/").strip().removesuffix(SUFFIX).removesuffix(".yml")
    if "/" not in name and benchmark is not None:
        name = f"{benchmark}/{name}"
    every = shipped()
    if name in every:
        owner = name.partition("/")[0]
        if benchmark is not None and owner != benchmark:
            raise ConfigError(
                f"{str(spec)!r} is a config of `mmunlearn {owner}`, not of `mmunlearn {benchmark}`; "
                f"{_listing(benchmark)}",
                "config",
            )
        return every[name]
    raise ConfigError(
        f"{str(spec)!r} is neither a file nor a shipped config; {_listing(benchmark)} "
        f"(`mmunlearn {benchmark or '<benchmark>'} configs` says what each runs)",
        "config",
    )
