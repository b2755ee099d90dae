"""The corpus, read as a stream: JSON Lines, Parquet, CSV/TSV and plain text; a file, a folder or a glob.

A file's rows come in order, a block at a time (:class:`Rows`), never the file whole. A row's id is its
``--id-field`` when one is given, else ``FILE:N``: the file's path from the input root and the row's
line (JSON Lines and plain text: the line; CSV/TSV: the data row's number plus one for the header, its
line unless a quoted field spans lines; Parquet: the row's number, from 1). A row whose field is missing
or not a string is bad (named in the service's words, like the HTTP API's field errors); a file that
cannot be read or parsed is an :class:`InputError`, which stops the job.

Plain text is one text a line (``\\n`` or ``\\r\\n``); every line is a row, a blank one is a bad row
("text is empty"). JSON Lines skips blank lines; any other line must be a JSON object. CSV and Parquet
columns are read by name, only the text and id columns; CSV cells are read as strings as written
(``007`` stays ``007``). ``.gz`` files of the line formats are read through gzip.
"""

from __future__ import annotations

import glob
import gzip
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal, cast

import orjson

from app.errors import json_kind

Format = Literal["jsonl", "parquet", "csv", "tsv", "text"]
FORMATS: tuple[Format, ...] = ("jsonl", "parquet", "csv", "tsv", "text")
# File name endings by format; ``.gz`` of each line format too.
SUFFIXES: dict[str, Format] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
    ".txt": "text",
}
# Rows per block: large enough that a block costs little per row, small enough to stream.
BLOCK_ROWS = 1024


class InputError(Exception):
    """An input that cannot be read or parsed: the job stops with this one line (exit status 2)."""


@dataclass(frozen=True)
class Fields:
    """Which field of a row holds the text, and which its id (None: the row's number)."""

    text: str = "text"
    id: str | None = None


@dataclass(frozen=True)
class InputFile:
    path: Path
    name: str  # relative to the input root, with /: the FILE of a row's default id
    format: Format


@dataclass
class Rows:
    """Consecutive rows of one file: each one's id and text (None for a bad row), and why each bad row is
    bad. A row whose id field is unusable has its ``FILE:N`` for an id."""

    ids: list[str]
    texts: list[str | None]
    bad: dict[int, str] = field(default_factory=dict)  # position → what is wrong with it

    def __len__(self) -> int:
        return len(self.ids)

    def slice(self, start: int, stop: int) -> Rows:
        return Rows(
            self.ids[start:stop],
            self.texts[start:stop],
            {i - start: b for i, b in self.bad.items() if start <= i < stop},
        )


def format_of(path: Path) -> Format | None:
    """The format a file name says (``x.jsonl``, ``x.csv.gz``), or None."""
    suffixes = path.suffixes
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    found = SUFFIXES.get(suffixes[-1].lower()) if suffixes else None
    if found == "parquet" and path.suffix == ".gz":
        return None  # a gzipped Parquet file is not a thing pyarrow reads
    return found


def find_inputs(
    spec: str, forced: Format | None, fields: Fields, exclude: Path | None = None
) -> list[InputFile]:
    """The input files ``spec`` names: a file, a folder (its files of known formats, recursively, in name
    order; hidden ones and ones starting with ``_`` skipped) or a glob (``data/*.jsonl``, ``**`` too).

    Args:
        spec: the ``--input``.
        forced: ``--format``: every file is read as this; None: by each file's name.
        fields: ``--text-field`` and ``--id-field`` (a plain text file has no id field).
        exclude: a folder never read from (the job's own output).

    Raises:
        InputError: nothing there, a file of unknown format, or an id field for plain text.
    """
    given = Path(spec).expanduser()
    if given.is_file():
        root, paths = given.parent, [given]
    elif given.is_dir():
        root = given
        paths = sorted(
            p
            for p in given.rglob("*")
            if p.is_file()
            and not any(part.startswith((".", "_")) for part in p.relative_to(given).parts)
            and (forced is not None or format_of(p) is not None)
        )
        if not paths:
            raise InputError(f"{spec} holds no input files ({', '.join(SUFFIXES)}, or give --format)")
    elif glob.has_magic(spec):
        paths = sorted(
            Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True) if Path(p).is_file()
        )
        if not paths:
            raise InputError(f"{spec} matches no files")
        fixed = [part for part in Path(os.path.expanduser(spec)).parts if not glob.has_magic(part)]
        root = Path(*fixed) if fixed else Path(".")
        while not root.is_dir():
            root = root.parent
    else:
        raise InputError(f"{spec} does not exist")
    if exclude is not None:
        out = exclude.resolve()
        paths = [p for p in paths if not p.resolve().is_relative_to(out)]
    files = []
    for p in paths:
        fmt = forced or format_of(p)
        if fmt is None:
            raise InputError(
                f"{p}: unknown format (name it .jsonl, .parquet, .csv, .tsv or .txt, or give --format)"
            )
        if fmt == "text" and fields.id is not None:
            raise InputError(f"{p} is plain text, which has no fields: leave out --id-field")
        files.append(InputFile(p, p.relative_to(root).as_posix() if p.is_relative_to(root) else p.name, fmt))
    if not files:
        raise InputError(f"{spec} names only files inside the output folder")
    return files


def read(file: InputFile, fields: Fields, block_rows: int = BLOCK_ROWS) -> Iterator[Rows]:
    """``file``'s rows in order, ``block_rows`` at a time.

    Raises:
        InputError: the file cannot be opened, is not UTF-8, or is not valid in its format.
    """
    readers = {"jsonl": _jsonl, "text": _text, "csv": _csv, "tsv": _csv, "parquet": _parquet}
    try:
        yield from readers[file.format](file, fields, block_rows)
    except OSError as exc:
        raise InputError(f"{file.path}: cannot be read: {exc.strerror or exc}") from None


def count_rows(files: list[InputFile]) -> int:
    """About how many rows ``files`` hold, for the progress bar: Parquet's own counts, lines otherwise
    (a pass over the bytes, no parsing)."""
    import pyarrow.parquet as pq

    total = 0
    for f in files:
        try:
            if f.format == "parquet":
                total += pq.ParquetFile(f.path).metadata.num_rows
                continue
            with _open(f.path) as stream:
                while chunk := stream.read(1 << 20):
                    total += chunk.count(b"\n")
            if f.format in ("csv", "tsv"):
                total -= 1
        except (OSError, ValueError):  # the reading itself reports it, with its one line
            continue
    return max(total, 0)


# --- the formats ---------------------------------------------------------------------------------


def _open(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return cast(IO[bytes], gzip.GzipFile(path, "rb"))
    return open(path, "rb")


def _lines(file: InputFile) -> Iterator[tuple[int, str]]:
    """(line number from 1, the line without its end) of a UTF-8 file."""
    with _open(file.path) as stream:
        for n, raw in enumerate(stream, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"{file.path} line {n}: not UTF-8 ({exc.reason} at byte {exc.start})"
                ) from None
            if line.endswith("\n"):
                line = line[:-2] if line.endswith("\r\n") else line[:-1]
            yield n, line


def _text(file: InputFile, fields: Fields, block_rows: int) -> Iterator[Rows]:
    return _blocks(file, block_rows, lambda rows, n, line: _add_line(rows, f"{file.name}:{n}", line))


def _add_line(rows: Rows, row_id: str, line: str) -> None:
    rows.ids.append(row_id)
    rows.texts.append(line)


def _jsonl(file: InputFile, fields: Fields, block_rows: int) -> Iterator[Rows]:
    def add(rows: Rows, n: int, line: str) -> None:
        if not line.strip():
            return
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise InputError(f"{file.path} line {n}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise InputError(f"{file.path} line {n}: a row must be a JSON object, not {json_kind(obj)}")
        _add(rows, f"{file.name}:{n}", obj.get(fields.text, _MISSING), obj, fields)

    return _blocks(file, block_rows, add)


def _blocks(file: InputFile, block_rows: int, add: Callable[[Rows, int, str], None]) -> Iterator[Rows]:
    """Blocks of the rows ``add`` makes of a line format's lines. At a line it cannot read, the rows
    before it come first, then the error: the job embeds everything up to the broken line."""
    rows = Rows([], [])
    try:
        for n, line in _lines(file):
            add(rows, n, line)
            if len(rows) == block_rows:
                yield rows
                rows = Rows([], [])
    except InputError:
        if rows.ids:
            yield rows
        raise
    if rows.ids:
        yield rows


def _csv(file: InputFile, fields: Fields, block_rows: int) -> Iterator[Rows]:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    columns = [fields.text] + ([fields.id] if fields.id and fields.id != fields.text else [])
    try:
        reader = pcsv.open_csv(
            file.path,
            read_options=pcsv.ReadOptions(block_size=1 << 20),
            parse_options=pcsv.ParseOptions(
                delimiter="\t" if file.format == "tsv" else ",", newlines_in_values=True
            ),
            convert_options=pcsv.ConvertOptions(
                include_columns=columns,
                column_types=dict.fromkeys(columns, pa.string()),
                strings_can_be_null=False,
            ),
        )
        yield from _batches(file, fields, reader, first_number=2)
    except (pa.ArrowInvalid, pa.ArrowKeyError) as exc:
        raise InputError(f"{file.path}: {exc}") from None


def _parquet(file: InputFile, fields: Fields, block_rows: int) -> Iterator[Rows]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(file.path)
        schema = parquet.schema_arrow
        for name, allowed in ((fields.text, "strings"), (fields.id, "strings or integers")):
            if name is None:
                continue
            if name not in schema.names:
                raise InputError(f"{file.path} has no column {name!r} (it has {', '.join(schema.names)})")
            kind = schema.field(name).type
            ok = pa.types.is_string(kind) or pa.types.is_large_string(kind)
            if name == fields.id:
                ok = ok or pa.types.is_integer(kind)
            if not ok:
                raise InputError(f"{file.path}: column {name!r} holds {kind}, not {allowed}")
        columns = list(dict.fromkeys(c for c in (fields.text, fields.id) if c))
        yield from _batches(file, fields, parquet.iter_batches(batch_size=block_rows, columns=columns), 1)
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        raise InputError(f"{file.path}: not a readable Parquet file: {exc}") from None


def _batches(file: InputFile, fields: Fields, batches: Iterator[object], first_number: int) -> Iterator[Rows]:
    """Rows from pyarrow record batches (CSV, Parquet): numbered from ``first_number``."""
    n = first_number
    for batch in batches:
        texts = batch.column(fields.text).to_pylist()  # type: ignore[attr-defined]
        ids = batch.column(fields.id).to_pylist() if fields.id else None  # type: ignore[attr-defined]
        rows = Rows([], [])
        if ids is None and all(type(t) is str for t in texts):  # the usual block: no per-row branches
            rows.ids = [f"{file.name}:{k}" for k in range(n, n + len(texts))]
            rows.texts = texts
        else:
            for k, text in enumerate(texts):
                row = {fields.id: ids[k]} if fields.id is not None and ids is not None else {}
                _add(rows, f"{file.name}:{n + k}", text, row, fields)
        n += len(texts)
        if rows.ids:
            yield rows


# --- one row's fields, in the API's words ----------------------------------------------------------

_MISSING = object()


def field_problem(name: str, value: object, integers: bool = False) -> str | None:
    """What is wrong with a row's field ``name`` holding ``value``, as the HTTP API says it of a request
    field (``text is required``, ``text must be a string, not a number``); None when it is a string
    (or, with ``integers``, an integer)."""
    if value is _MISSING:
        return f"{name} is required"
    if type(value) is str or (integers and type(value) is int):
        return None
    return f"{name} must be {'a string or an integer' if integers else 'a string'}, not {json_kind(value)}"


def _add(rows: Rows, source: str, text: object, row: dict[str, object], fields: Fields) -> None:
    """One row into ``rows``: its id (the id field, or ``source``) and text, or why it is bad."""
    row_id = source
    problem = None
    if fields.id is not None:
        value = row.get(fields.id, _MISSING)
        problem = field_problem(fields.id, value, integers=True)
        if problem is None:
            row_id = str(value)
    problem = problem or field_problem(fields.text, text)
    rows.ids.append(row_id)
    if problem is None:
        rows.texts.append(text)  # type: ignore[arg-type]
    else:
        rows.bad[len(rows.texts)] = problem
        rows.texts.append(None)
