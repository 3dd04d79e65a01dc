"""Rank placement helpers of trainsim.run.ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainsim.run.ranks import ThreadClock, pin_refused_note, thread_sched


def test_pin_refused_note_names_each_reason_once() -> None:
    assert pin_refused_note([None, None]) is None
    assert pin_refused_note([]) is None
    note = pin_refused_note(["[Errno 22] Invalid argument", None, "[Errno 22] Invalid argument"])
    assert note is not None and note.count("Invalid argument") == 1 and "unpinned" in note


def test_pin_to_core_keeps_the_process_and_later_threads_on_one_core() -> None:
    """In a child process (pinning is for good): rank r lands on core r modulo the allowed cores, and a
    thread started afterwards inherits it."""
    code = (
        "import json, os, threading\n"
        "from trainsim.run.ranks import pin_to_core\n"
        "assert pin_to_core(3) is None\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))\n"
        "t.start(); t.join()\n"
        "print(json.dumps([sorted(os.sched_getaffinity(0)), seen[0]]))\n"
    )
    process, thread = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    cores = sorted(os.sched_getaffinity(0))
    assert process == thread == [cores[3 % len(cores)]]


@pytest.mark.skipif(not thread_sched(), reason="no /proc/self/task/*/schedstat on this kernel")
def test_thread_clock_counts_cpu_where_a_thread_computes_not_where_it_sleeps() -> None:
    """One window: the main thread spins 60 ms while a helper thread waits; then two windows around a
    30 ms spin each. CPU lands on the thread that did the work, by name, and the windows add up; a
    thread that started inside the window counts whole."""
    import threading
    import time

    def spin(s: float) -> None:
        end = time.thread_time() + s
        while time.thread_time() < end:
            pass

    clock = ThreadClock()
    clock.start()
    release = threading.Event()
    helper = threading.Thread(target=release.wait)
    helper.start()
    spin(0.06)
    clock.stop()  # the helper still alive: a thread that ended inside the window has left /proc
    release.set()
    helper.join()
    one = clock.per_step(1)
    assert one["main"]["run_ms"] >= 55.0
    assert one["main"]["wait_ms"] >= 0.0
    sleepers = [v for k, v in one.items() if k != "main"]  # the helper, by the name the kernel gives it
    assert sleepers and all(v["run_ms"] < 20.0 for v in sleepers)
    for _ in range(2):
        clock.start()
        spin(0.03)
        clock.stop()
    assert clock.per_step(2)["main"]["run_ms"] >= (60.0 + 55.0) / 2  # per step over both windows
    with pytest.raises(RuntimeError, match="without start"):
        ThreadClock().stop()
