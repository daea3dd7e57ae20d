"""InTurns: a callback-style job runs one batch per step, never while the worker runs; its result and
errors reach the worker; closing it mid-way cancels the job, which cleans up before the close returns."""

from __future__ import annotations

import threading

import pytest

from turborag.serve.turns import InTurns


def test_one_batch_a_step_and_never_while_the_worker_runs():
    log: list[str] = []

    def work(turn):
        for tokens in (4, 8, 16):
            log.append(f"batch {tokens}")
            turn(tokens)
        log.append("commit")
        return "added"

    steps = InTurns(work, threading.Event()).steps()
    got = []
    while True:
        try:
            tokens = next(steps)
        except StopIteration as done:
            result = done.value
            break
        got.append(tokens)
        log.append("worker")  # the work is parked in its turn: nothing of it runs now
    assert got == [4, 8, 16] and result == "added"
    assert log == ["batch 4", "worker", "batch 8", "worker", "batch 16", "worker", "commit"]


def test_the_work_s_error_reaches_the_worker():
    def work(turn):
        turn(1)
        raise ValueError("no text could be extracted")

    steps = InTurns(work, threading.Event()).steps()
    assert next(steps) == 1
    with pytest.raises(ValueError, match="no text"):
        next(steps)


def test_closing_cancels_and_waits_for_the_clean_up():
    cancelled, cleaned = threading.Event(), []

    def work(turn):
        try:
            for _ in range(100):
                turn(2)
                if cancelled.is_set():
                    raise RuntimeError("cancelled")
        finally:
            cleaned.append(True)

    steps = InTurns(work, cancelled).steps()
    assert next(steps) == 2 and next(steps) == 2
    steps.close()
    assert cancelled.is_set() and cleaned == [True]
