"""The readers: each format gives the same rows and ids, bad rows are named as the API names a field,
and a file that cannot be read stops the job with one line."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.bulk import sources
from app.bulk.sources import Fields, InputError, count_rows, field_problem, find_inputs, read
from app.errors import json_kind

TEXTS = ["你好", "北京是首都", "007 号", "一行,有逗号"]


def rows_of(
    path: Path, fields: Fields | None = None, forced: sources.Format | None = None
) -> list[tuple[str, str | None, str | None]]:
    out = []
    fields = fields or Fields()
    for f in find_inputs(str(path), forced, fields):
        for rows in read(f, fields, block_rows=3):  # several blocks: numbering runs across them
            out += [(rows.ids[i], rows.texts[i], rows.bad.get(i)) for i in range(len(rows))]
    return out


def write_all_formats(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "jsonl": folder / "a.jsonl",
        "text": folder / "a.txt",
        "csv": folder / "a.csv",
        "tsv": folder / "a.tsv",
        "parquet": folder / "a.parquet",
    }
    paths["jsonl"].write_bytes(
        b"".join(orjson.dumps({"text": t, "n": i}) + b"\n" for i, t in enumerate(TEXTS))
    )
    paths["text"].write_text("".join(t + "\n" for t in TEXTS), encoding="utf-8")
    paths["csv"].write_text(
        "n,text\n" + "".join(f'{i},"{t}"\n' for i, t in enumerate(TEXTS)), encoding="utf-8"
    )
    paths["tsv"].write_text(
        "n\ttext\n" + "".join(f"{i}\t{t}\n" for i, t in enumerate(TEXTS)), encoding="utf-8"
    )
    pq.write_table(pa.table({"n": list(range(len(TEXTS))), "text": TEXTS}), paths["parquet"])
    return paths


def test_every_format_gives_the_texts_in_order_with_file_and_line_ids(tmp_path: Path) -> None:
    paths = write_all_formats(tmp_path)
    for fmt, path in paths.items():
        got = rows_of(path)
        assert [t for _, t, _ in got] == TEXTS, fmt
        first = 2 if fmt in ("csv", "tsv") else 1  # CSV/TSV: line 1 is the header
        assert [i for i, _, _ in got] == [f"{path.name}:{n}" for n in range(first, first + len(TEXTS))], fmt
        assert all(bad is None for _, _, bad in got), fmt


def test_an_id_field_gives_the_ids_and_integers_become_their_digits(tmp_path: Path) -> None:
    paths = write_all_formats(tmp_path)
    for fmt in ("jsonl", "csv", "tsv", "parquet"):
        assert [i for i, _, _ in rows_of(paths[fmt], Fields("text", "n"))] == ["0", "1", "2", "3"], fmt
    with pytest.raises(InputError, match="plain text, which has no fields"):
        find_inputs(str(paths["text"]), None, Fields("text", "n"))


def test_a_folder_is_read_recursively_in_name_order_skipping_hidden_and_unknown_files(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x.txt").write_text("乙\n")
    (tmp_path / "a.txt").write_text("甲\n")
    (tmp_path / "README.md").write_text("not input")
    (tmp_path / ".hidden.txt").write_text("no")
    (tmp_path / "_state").mkdir()
    (tmp_path / "_state" / "y.txt").write_text("no")
    assert rows_of(tmp_path) == [("a.txt:1", "甲", None), ("b/x.txt:1", "乙", None)]
    # A glob takes what it matches (dot files aside, as glob does), named from the folder it starts in.
    assert [i for i, _, _ in rows_of(Path(f"{tmp_path}/**/*.txt"))] == [
        "_state/y.txt:1",
        "a.txt:1",
        "b/x.txt:1",
    ]


def test_the_output_folder_is_never_read_as_input(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("甲\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "part-00000.txt").write_text("no\n")
    files = find_inputs(str(tmp_path), None, Fields(), exclude=tmp_path / "out")
    assert [f.name for f in files] == ["a.txt"]


def test_gzipped_line_formats_are_read(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "a.jsonl.gz", "wb") as f:
        f.write(orjson.dumps({"text": "你好"}) + b"\n")
    with gzip.open(tmp_path / "b.csv.gz", "wt") as f:
        f.write("text\n北京\n")
    assert rows_of(tmp_path) == [("a.jsonl.gz:1", "你好", None), ("b.csv.gz:2", "北京", None)]


def test_plain_text_keeps_blank_lines_as_rows_and_json_lines_skips_them(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes("甲\r\n\n乙\n".encode())
    assert rows_of(tmp_path / "a.txt") == [
        ("a.txt:1", "甲", None),
        ("a.txt:2", "", None),
        ("a.txt:3", "乙", None),
    ]
    (tmp_path / "b.jsonl").write_bytes(b'{"text": "a"}\n\n  \n{"text": "b"}\n')
    assert [i for i, _, _ in rows_of(tmp_path / "b.jsonl")] == ["b.jsonl:1", "b.jsonl:4"]


def test_missing_and_non_string_fields_are_bad_rows_in_the_apis_words(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(
        b'{"text": 5}\n{"other": "x"}\n{"text": null}\n{"text": ["a"]}\n{"text": "ok", "id": 1.5}\n'
    )
    got = rows_of(path, Fields("text", "id"))
    assert [bad for _, _, bad in got] == [
        "id is required",
        "id is required",
        "id is required",
        "id is required",
        "id must be a string or an integer, not a number",
    ]
    got = rows_of(path)
    assert [bad for _, _, bad in got] == [
        "text must be a string, not a number",
        "text is required",
        "text must be a string, not null",
        "text must be a string, not an array",
        None,
    ]
    assert all(text is None for _, text, bad in got if bad)
    table = pa.table({"text": pa.array(["a", None], pa.string()), "id": pa.array([None, 7], pa.int64())})
    pq.write_table(table, tmp_path / "a.parquet")
    got = rows_of(tmp_path / "a.parquet", Fields("text", "id"))
    assert got == [
        ("a.parquet:1", None, "id must be a string or an integer, not null"),
        ("7", None, "text must be a string, not null"),
    ]


def test_the_kinds_of_values_are_named_as_the_http_api_names_them() -> None:
    for value in (None, 5, 1.5, True, [1], {"a": 1}):
        assert field_problem("text", value) == f"text must be a string, not {json_kind(value)}"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("a.jsonl", b'{"text": "a"}\n{"text": \n', "a.jsonl line 2: not JSON"),
        ("b.jsonl", b'["a"]\n', "b.jsonl line 1: a row must be a JSON object, not an array"),
        ("c.txt", "好\n".encode() + b"\xff\xfe\n", "c.txt line 2: not UTF-8"),
        ("d.csv", b"other\nx\n", "Column 'text' in include_columns does not exist"),
        ("e.parquet", b"not parquet at all", "not a readable Parquet file"),
    ],
)
def test_a_malformed_file_is_one_line_that_names_it(
    tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(InputError) as caught:
        rows_of(tmp_path / name)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_parquet_columns_are_checked_against_the_files_schema(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "a.parquet")
    with pytest.raises(InputError, match="column 'text' holds int64, not strings"):
        rows_of(tmp_path / "a.parquet")
    with pytest.raises(InputError, match="has no column 'body'"):
        rows_of(tmp_path / "a.parquet", Fields("body"))


def test_nothing_to_read_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        find_inputs(str(tmp_path / "nope.jsonl"), None, Fields())
    with pytest.raises(InputError, match="matches no files"):
        find_inputs(str(tmp_path / "*.jsonl"), None, Fields())
    with pytest.raises(InputError, match="holds no input files"):
        find_inputs(str(tmp_path), None, Fields())
    (tmp_path / "a.xml").write_text("<a/>")
    with pytest.raises(InputError, match="unknown format"):
        find_inputs(str(tmp_path / "a.xml"), None, Fields())
    assert [f.format for f in find_inputs(str(tmp_path / "a.xml"), "text", Fields())] == ["text"]


def test_rows_are_counted_for_the_progress_bar(tmp_path: Path) -> None:
    paths = write_all_formats(tmp_path)
    for fmt, path in paths.items():
        assert count_rows(find_inputs(str(path), None, Fields())) == len(TEXTS), fmt
