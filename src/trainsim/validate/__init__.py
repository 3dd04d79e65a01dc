"""trainsim.validate"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def progress_log(console: Any) -> Callable[[str], None]:
    """A harness's progress lines on ``console`` (stderr), each with the seconds since this call. Shown
    with ``--json`` too: the JSON object goes to stdout alone, and a harness runs for up to twenty
    minutes."""
    import time

    t0 = time.monotonic()
    return lambda s: console.print(f"[dim]{time.monotonic() - t0:6.1f}s[/] {s}")
