"""Rank placement helpers of trainsim.run.ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from trainsim.run.ranks import pin_refused_note


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
