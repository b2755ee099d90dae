"""Progress a person can read: a tqdm bar on a terminal (rows, texts/s, tokens/s, ETA, skipped rows), a
log line every few seconds otherwise, and one summary line at the end."""

from __future__ import annotations

import sys
import time
from typing import IO, Any


def _si(value: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """Counts what the job has done and shows it: ``mode`` "bar" (tqdm), "log" (a line every
    ``every`` seconds) or "off"; "auto" is a bar on a terminal, log lines otherwise."""

    def __init__(self, mode: str = "auto", every: float = 10.0, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "log"
        self.mode = mode
        self.every = every
        self.rows = self.embedded = self.skipped = self.tokens = 0
        self.total: int | None = None
        self._resumed = 0  # rows done by earlier runs: not part of this run's rates
        self._start = time.monotonic()
        self._last_log = self._start
        self._bar: Any = None
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=None, unit=" rows", file=self.stream, dynamic_ncols=True, smoothing=0.05)

    def resumed(self, rows: int) -> None:
        """``rows`` were done by an earlier run."""
        self.rows += rows
        self._resumed = rows
        if self._bar is not None:  # from here, and not counted in its rate (tqdm's ``initial``)
            self._bar.initial = self._bar.n = rows
            self._bar.refresh()

    def set_total(self, total: int) -> None:
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def update(self, rows: int, embedded: int, tokens: int) -> None:
        self.rows += rows
        self.embedded += embedded
        self.skipped += rows - embedded
        self.tokens += tokens
        now = time.monotonic()
        if self._bar is not None:
            self._bar.update(rows)
            elapsed = max(now - self._start, 1e-9)
            self._bar.set_postfix_str(
                f"{_si(self.embedded / elapsed)} texts/s, {_si(self.tokens / elapsed)} tokens/s, "
                f"{self.skipped} skipped",
                refresh=False,
            )
        elif self.mode == "log" and now - self._last_log >= self.every:
            self._last_log = now
            print(f"zhembed bulk: {self.line(now)}", file=self.stream, flush=True)

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self._start, 1e-9)
        done = self.rows - self._resumed
        rate = done / elapsed
        where = f"{self.rows:,} rows"
        eta = ""
        if self.total:
            where = f"{self.rows:,} / {self.total:,} rows ({100 * min(self.rows / self.total, 1):.1f}%)"
            if rate > 0 and self.total > self.rows:
                eta = f", ETA {_duration((self.total - self.rows) / rate)}"
        return (
            f"{where}, {self.embedded / elapsed:.1f} texts/s, {_si(self.tokens / elapsed)} tokens/s, "
            f"{self.skipped:,} skipped{eta}"
        )

    def close(self) -> float:
        """Stop showing progress; the seconds this run took."""
        if self._bar is not None:
            self._bar.close()
        return time.monotonic() - self._start
