"""loadtest.bulk runs end to end on the tiny model and prints its table (the figures are the benchmark's,
not the test's: only that every row is there)."""

from __future__ import annotations

from tests.loadtest.conftest import run_module


def test_the_bulk_benchmark_prints_its_rows() -> None:
    out = run_module(
        "loadtest.bulk", "--quick", "--skip-ray", "--batch-sizes", "8,16", "--memory-rows", "300,600"
    )
    for row in (
        "| raw int8, batch ",
        "| job (read, embed, write Parquet) |",
        "| memory, 300 rows",
        "| memory, 600 rows",
        "| memory ratio 600 / 300 rows |",
    ):
        assert row in out, out


def test_char_rows_are_one_character_each_and_numbered_rows_distinct() -> None:
    from loadtest.bulk import row_texts

    chars = list(row_texts(5000, "char"))
    assert len(chars) == 5000 and all(len(c) == 1 and not c.isspace() for c in chars)
    assert len(set(chars)) > 100  # the corpus's characters, cycled: not one character repeated
    numbered = list(row_texts(2000, "numbered"))
    assert len(set(numbered)) == 2000
