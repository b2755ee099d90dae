"""Progress: log lines every few seconds off a terminal (rows, rates, skipped, ETA), a tqdm bar on one."""

from __future__ import annotations

import io
import time

from app.bulk.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_it_logs_a_line_every_few_seconds_with_rates_and_eta() -> None:
    out = io.StringIO()
    progress = Progress("auto", every=0.05, stream=out)
    assert progress.mode == "log"
    progress.set_total(1000)
    progress.update(100, 98, 4000)
    assert out.getvalue() == ""  # not yet: the first line comes after `every` seconds
    time.sleep(0.06)
    progress.update(100, 100, 4000)
    (line,) = out.getvalue().splitlines()
    assert line.startswith("zhembed bulk: 200 / 1,000 rows (20.0%), ")
    assert "texts/s" in line and "tokens/s" in line and "2 skipped" in line and ", ETA " in line
    assert progress.close() > 0


def test_rows_done_by_an_earlier_run_count_for_the_position_not_the_rate() -> None:
    progress = Progress("log", every=3600, stream=io.StringIO())
    progress.resumed(900)
    progress.set_total(1000)
    progress.update(10, 10, 100)
    assert progress.line().startswith("910 / 1,000 rows (91.0%)")
    assert progress.rows == 910 and progress.embedded == 10


def test_on_a_terminal_it_is_a_tqdm_bar() -> None:
    out = Terminal()
    progress = Progress("auto", stream=out)
    assert progress.mode == "bar"
    progress.set_total(50)
    progress.update(20, 19, 300)
    progress.close()
    text = out.getvalue()
    assert "20/50" in text and "1 skipped" in text and "texts/s" in text
