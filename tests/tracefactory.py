"""Hand-made Kineto traces for tests, where the right graph and timeline are known."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

PID, MAIN, BWD = 100, 100, 101


class TraceMaker:
    """Collects events with the fields torch.profiler writes; ``write`` saves them as a trace."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 1000

    def cpu(self, name: str, ts: float, dur: float, tid: int = MAIN, cat: str = "cpu_op", **args: Any) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
                            "args": args})  # fmt: skip

    def step(self, n: int, ts: float, dur: float) -> None:
        self.cpu(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def launch(self, ts: float, dur: float, k_ts: float, k_dur: float, *, name: str = "cudaLaunchKernel",
               kernel: str = "gemm_kernel", stream: int = 7, tid: int = MAIN, cat: str = "kernel",
               **kargs: Any) -> int:  # fmt: skip
        """A runtime call on the CPU and the GPU task it launched (same correlation id)."""
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": tid, "ts": ts,
                            "dur": dur, "args": {"correlation": self.corr}})  # fmt: skip
        self.events.append({"ph": "X", "cat": cat, "name": kernel, "pid": 0, "tid": stream, "ts": k_ts,
                            "dur": k_dur, "args": {"correlation": self.corr, "device": 0, "stream": stream,
                                                   **kargs}})  # fmt: skip
        return self.corr

    def runtime(self, name: str, ts: float, dur: float, tid: int = MAIN) -> None:
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": tid, "ts": ts,
                            "dur": dur, "args": {"correlation": self.corr}})  # fmt: skip

    def write(self, path: Path, gz: bool = False) -> Path:
        data = json.dumps({"schemaVersion": 1, "traceEvents": self.events}).encode()
        path.write_bytes(gzip.compress(data) if gz else data)
        return path
