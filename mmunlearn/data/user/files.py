"""Reading a user's forget/retain source into raw items: files by suffix (JSON, JSONL, CSV/TSV, .txt), lists, datasets.

Shared by the text and speech readers (:mod:`mmunlearn.data.user.sets`, :mod:`mmunlearn.data.user.speech`): each item
comes with where it was found (``path:line``, ``path row i`` or ``name[i]``), which every error message names.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from mmunlearn.data.manifest import AUDIO_SUFFIXES
from mmunlearn.errors import UserError

#: File name endings each reader takes.
TEXT_SUFFIXES = (".json", ".jsonl", ".ndjson", ".csv", ".tsv", ".txt")
SPEECH_SUFFIXES = (".json", ".jsonl", ".ndjson", ".csv", ".tsv")


class DataFormatError(UserError, ValueError):
    """A forget or retain set that cannot be read: one line naming the file (or set), the row and what is wrong."""


# ---------------------------------------------------------------------------------------------- sources
Item = tuple[str, Any]  # (where, raw item): where names the file and line, or the set and index


def short(value: Any) -> str:
    """A value as a message shows it: its repr, cut at 80 characters."""
    return f"{value!r:.80}"


def _where(label: str, i: int) -> str:
    return f"{label} row {i}"


#: The longest line (or CSV record) of a set file, in characters: a row is a question and its answer or one passage.
MAX_LINE = 1 << 20
#: The largest ``.json`` set file (read whole, as one JSON value); JSONL, CSV and ``.txt`` are read a line at a time.
MAX_JSON_BYTES = 1 << 30


def _open_regular(path: Path) -> io.TextIOWrapper:
    """``path`` opened as UTF-8 text (a BOM dropped), refused unless it is a regular file: a FIFO, a device or a link
    to one is never waited on or read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise DataFormatError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise DataFormatError(f"{path}: a folder, not a file") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DataFormatError(f"{path}: not a regular file (a FIFO, device or socket): refusing to read it")
    os.set_blocking(fd, True)
    return open(fd, encoding="utf-8-sig", newline="")


def _lines(path: Path, fh: io.TextIOWrapper) -> Iterator[tuple[int, str]]:
    """(line number, line) of an open text file, one at a time; a line over :data:`MAX_LINE` characters is refused."""
    for n in itertools.count(1):
        line = fh.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith("\n"):
            raise DataFormatError(
                f"{path}:{n}: a line over {MAX_LINE:,} characters (a row is a question and its answer, or one passage)"
            )
        yield n, line.rstrip("\r\n")


def _jsonl_items(path: Path, fh: io.TextIOWrapper) -> list[Item]:
    items = []
    for line, raw in _lines(path, fh):
        if raw.strip():
            try:
                items.append((f"{path}:{line}", json.loads(raw)))
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{path}:{line}: not a JSON value ({exc.msg})") from None
            except RecursionError:
                raise DataFormatError(f"{path}:{line}: a JSON value nested too deeply") from None
            except ValueError as exc:  # e.g. an integer of 100,000 digits
                raise DataFormatError(f"{path}:{line}: not a usable JSON value ({exc})") from None
    return items


def _file_items(path: Path, text: bool) -> list[Item]:
    """The raw items of a file, by its suffix; JSON objects, CSV rows as dicts, ``.txt`` texts as strings. Read a
    line at a time (JSONL, CSV, ``.txt``), so a bad first line is refused before the rest is read."""
    suffix = path.suffix.lower()
    accepted = TEXT_SUFFIXES if text else SPEECH_SUFFIXES
    if suffix not in accepted:
        raise DataFormatError(f"{path}: unknown file type {suffix or '(no suffix)'!r}; accepted: {', '.join(accepted)}")
    with _open_regular(path) as fh:
        try:
            if suffix == ".json":
                if os.fstat(fh.fileno()).st_size > MAX_JSON_BYTES:
                    raise DataFormatError(
                        f"{path}: larger than {MAX_JSON_BYTES >> 20} MiB; give a large set as JSONL "
                        "(read a line at a time)"
                    )
                return _json_items(path, fh.read())
            if suffix in (".jsonl", ".ndjson"):
                return _jsonl_items(path, fh)
            if suffix == ".txt":
                return _txt_items(path, [line for _, line in _lines(path, fh)])
            return _csv_items(path, fh, "\t" if suffix == ".tsv" else ",", text)
        except UnicodeDecodeError as exc:
            raise DataFormatError(f"{path}: not UTF-8 text ({exc})") from None


def _json_items(path: Path, content: str) -> list[Item]:
    try:
        data = json.loads(content)
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise DataFormatError(f"{path}: JSON nested too deeply to be a list of rows") from None
    except ValueError as exc:  # e.g. an integer of 100,000 digits
        raise DataFormatError(f"{path}: not usable JSON ({exc})") from None
    if isinstance(data, Mapping):
        keys = [k for k in ("data", "rows") if isinstance(data.get(k), list)]
        if len(keys) != 1:
            raise DataFormatError(
                f"{path}: a JSON object needs its rows as one list under 'data' or 'rows'; "
                f"keys found: {', '.join(map(str, data)) or 'none'}"
            )
        data = data[keys[0]]
    if not isinstance(data, list):
        raise DataFormatError(
            f"{path}: expected a JSON list of rows (or an object with 'data'/'rows'), got {type(data).__name__}"
        )
    return [(_where(str(path), i), item) for i, item in enumerate(data)]


def _txt_items(path: Path, lines: list[str]) -> list[Item]:
    """One text per line, or paragraphs (lines joined by newlines) when a blank line separates texts."""
    if any(not line.strip() for line in lines) and sum(1 for line in lines if line.strip()) > 1:
        items, start, block = [], 0, []
        for n, line in enumerate([*lines, ""], start=1):
            if line.strip():
                start, block = (start or n), [*block, line.rstrip()]
            elif block:
                items.append((f"{path}:{start}", "\n".join(block)))
                start, block = 0, []
        return items
    return [(f"{path}:{n}", line) for n, line in enumerate(lines, start=1) if line.strip()]


def _csv_items(path: Path, fh: Iterable[str], delimiter: str, text: bool) -> list[Item]:
    reader = csv.reader(fh, delimiter=delimiter)  # a field over csv's limit (128 KiB) is a csv.Error
    try:  # line_num: the line a record ends on (a quoted field may span lines); blank records are skipped
        numbered = [(reader.line_num, r) for r in reader if any(cell.strip() for cell in r)]
    except csv.Error as exc:
        raise DataFormatError(f"{path}:{reader.line_num}: not a readable CSV file ({exc})") from None
    if not numbered:
        return []
    header = [h.strip() for h in numbered[0][1]]
    first = header[0] if header else ""
    if not text and len(header) == 2 and Path(first).suffix.lower() in AUDIO_SUFFIXES:
        header, body = ["wav", "spk_id"], numbered  # a headerless "path,label" file
    else:
        body = numbered[1:]
    items = []
    for n, cells in body:
        if len(cells) != len(header):
            raise DataFormatError(
                f"{path}:{n}: {len(cells)} field(s), the header has {len(header)} ({', '.join(header)})"
            )
        items.append((f"{path}:{n}", dict(zip(header, cells))))
    return items


def dataset_module(source: Any) -> Any:
    """The ``datasets`` module when ``source`` is one of its objects (it is then imported already), else None."""
    module = sys.modules.get("datasets")
    return module if module is not None and isinstance(source, (module.Dataset, module.DatasetDict)) else None


def _check_text_size(items: list[Item]) -> list[Item]:
    """Refuse a text row (a string, or a mapping's string values) over :data:`MAX_LINE` characters, naming it: a
    10 MB answer would cost minutes and gigabytes to score."""
    for where, item in items:
        values = item.values() if isinstance(item, Mapping) else item if isinstance(item, (list, tuple)) else [item]
        size = sum(len(v) for v in values if isinstance(v, str))
        if size > MAX_LINE:
            raise DataFormatError(
                f"{where}: a row of {size:,} characters, more than the {MAX_LINE:,} a row may have "
                "(a question and its answer, or one passage)"
            )
    return items


def source_items(source: Any, name: str, text: bool) -> tuple[list[Item], Path | None]:
    """The raw items of any accepted source and the folder its relative paths resolve from (a text row over
    :data:`MAX_LINE` characters refused)."""
    if text:
        items, base = _source_items(source, name, text)
        return _check_text_size(items), base
    return _source_items(source, name, text)


def _source_items(source: Any, name: str, text: bool) -> tuple[list[Item], Path | None]:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        return _file_items(path, text), path.absolute().parent
    module = dataset_module(source)
    if module is not None and isinstance(source, module.DatasetDict):
        raise DataFormatError(
            f"{name}: a DatasetDict holds several splits ({', '.join(source)}); pass one, "
            f"e.g. {name}=dataset[{next(iter(source), 'train')!r}]"
        )
    if module is not None or (isinstance(source, Iterable) and not isinstance(source, (bytes, Mapping))):
        return [(f"{name}[{i}]", item) for i, item in enumerate(source)], None
    raise DataFormatError(
        f"{name}: expected a file path, a list of rows or a datasets.Dataset, got {type(source).__name__}"
    )


def fields_named(row: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """The keys of ``row`` that match ``names`` case-insensitively (in the row's order)."""
    return [k for k in row if str(k).strip().lower() in names]


def fields_found(row: Mapping[str, Any]) -> str:
    """The keys of ``row`` as an error lists them."""
    return ", ".join(map(str, row)) or "none"
