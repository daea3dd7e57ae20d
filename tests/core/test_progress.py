"""Progress in a log file: plain lines every few seconds where a terminal gets a bar (core/progress.py)."""

from __future__ import annotations

import io

from turborag.core.progress import PlainProgress, progress_bar


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_not_a_terminal_gets_a_plain_line_every_few_seconds():
    clock, out = FakeClock(), io.StringIO()
    bar = PlainProgress("ingest", 800, "chunks", stream=out, every=5.0, clock=clock)
    bar.update(40)  # at once: no line
    clock.now += 4.9
    bar.update(40)  # 4.9 s: still none
    assert out.getvalue() == ""
    clock.now += 35.1
    bar.update(40)  # 40 s
    clock.now += 1
    bar.update(40)  # 1 s after the last line: none
    clock.now += 5
    bar.update(40)  # 46 s
    clock.now += 1
    bar.update(600)  # 47 s: done, within the interval
    bar.close()  # the last line, as the run ends
    bar.close()  # nothing new to say
    assert out.getvalue().splitlines() == [
        "ingest: 120/800 chunks, 15%, 40 s elapsed, ETA 227 s",
        "ingest: 200/800 chunks, 25%, 46 s elapsed, ETA 138 s",
        "ingest: 800/800 chunks, 100%, 47 s elapsed",
    ]


def test_a_short_run_writes_nothing_and_a_count_without_total_has_no_percent():
    clock, out = FakeClock(), io.StringIO()
    with PlainProgress("precompute", unit="tok", stream=out, clock=clock) as bar:
        bar.update(300)
    assert out.getvalue() == ""  # done within the interval: no noise in the log
    bar = PlainProgress("precompute", unit="tok", stream=out, clock=clock)
    clock.now += 6
    bar.update(1200)
    assert out.getvalue() == "precompute: 1200 tok, 6 s elapsed\n"


def test_progress_bar_picks_plain_lines_off_a_terminal_and_tqdm_on_one():
    clock, out = FakeClock(), io.StringIO()
    bar = progress_bar("eval", unit="q", iterable=[1, 2, 3], stream=out)
    assert isinstance(bar, PlainProgress) and bar.total == 3
    bar = PlainProgress("eval", unit="q", iterable=[1, 2, 3], stream=out, clock=clock)
    seen = []
    for x in bar:
        clock.now += 5
        seen.append(x)
    assert seen == [1, 2, 3]
    assert out.getvalue().splitlines()[0].startswith("eval: 1/3 q, 33%, ")
    resumed = progress_bar("finetune", total=10, unit="step", initial=4, stream=io.StringIO())
    resumed.set_postfix(loss="1.250")
    assert resumed.line() == "finetune: 4/10 step, 40%, 0 s elapsed, loss=1.250"
    assert not isinstance(progress_bar("eval", total=3, stream=Tty()), PlainProgress)
    assert not isinstance(progress_bar("eval", total=3, enabled=False, stream=out), PlainProgress)
