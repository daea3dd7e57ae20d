"""Progress for long runs (ingest, precompute, eval, fine-tune) that also shows in a log file.

A tqdm or rich bar redraws one terminal line; when stderr is a file or a pipe (`nohup`, a CI log, a job
scheduler) it shows nothing useful, so a run of an hour looks hung. `progress_bar` therefore gives a tqdm bar
on a terminal and a `PlainProgress` elsewhere, which prints one plain line every few seconds:

    ingest: 120/800 chunks, 15%, 40 s elapsed, ETA 227 s

Only the standard library and tqdm are imported here.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

EVERY_S = 5.0  # seconds between two plain progress lines


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is an interactive terminal (a bar can redraw itself there)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed stream
        return False


class PlainProgress:
    """A tqdm-like counter that writes a plain line to `stream` at most every `every` seconds (`EVERY_S`), and
    a last one on close if it wrote any (so a log shows where the run ended). `clock` is injectable for
    tests."""

    def __init__(
        self,
        desc: str,
        total: int | None = None,
        unit: str = "it",
        stream: TextIO | None = None,
        every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        initial: int = 0,
        iterable: Iterable | None = None,
    ):
        self.desc, self.total, self.unit = desc, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.every = EVERY_S if every is None else every
        self.clock = clock
        self.n = self._initial = initial
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            self.total = len(iterable)
        self.postfix = ""
        self.t0 = self._last = clock()
        self.lines = 0  # lines written so far
        self._written = initial  # the count the last line showed

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.clock() - self._last >= self.every:
            self._write()

    def set_postfix(self, **values: Any) -> None:
        """Extra `key=value` fields at the end of the line (tqdm's `set_postfix`: a loss, a rate)."""
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        """The last line, if the run was long enough to have written any before and moved on since."""
        if self.lines and self.n != self._written:
            self._write()

    def line(self) -> str:
        """The progress as one line, e.g. `ingest: 120/800 chunks, 15%, 40 s elapsed, ETA 227 s`."""
        elapsed = self.clock() - self.t0
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        parts = [f"{self.desc}: {count} {self.unit}"]
        if self.total:
            parts.append(f"{100 * self.n / self.total:.0f}%")
        parts.append(f"{elapsed:.0f} s elapsed")
        done = self.n - self._initial
        if self.total and 0 < done and self.n < self.total:
            parts.append(f"ETA {elapsed / done * (self.total - self.n):.0f} s")
        if self.postfix:
            parts.append(self.postfix)
        return ", ".join(parts)

    def _write(self) -> None:
        self._last, self._written = self.clock(), self.n
        self.lines += 1
        print(self.line(), file=self.stream, flush=True)

    def __iter__(self) -> Iterator:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_bar(
    desc: str,
    total: int | None = None,
    unit: str = "it",
    enabled: bool = True,
    initial: int = 0,
    iterable: Iterable | None = None,
    stream: TextIO | None = None,
) -> Any:
    """A tqdm bar on a terminal; plain lines every few seconds (`PlainProgress`) when `stream` (stderr by
    default) is not one. Both have tqdm's `update`, `set_postfix`, `close`, iteration and `with`."""
    stream = stream if stream is not None else sys.stderr
    if enabled and not is_terminal(stream):
        return PlainProgress(desc, total, unit, stream=stream, initial=initial, iterable=iterable)
    from tqdm import tqdm

    return tqdm(
        iterable, desc=desc, total=total, unit=unit, initial=initial, disable=not enabled, file=stream
    )
