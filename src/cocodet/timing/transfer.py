"""Host-to-device copy time, measured apart from the loader wait (docs/benchmarks.md: the transfer is
not the loader's wait).

On CUDA the copy is bracketed by CUDA events on the current stream and read later, so timing
does not serialise the copy with the step; elsewhere a wall clock brackets the (synchronous)
copy, so the same numbers exist on a CPU run.
"""

from __future__ import annotations

import time

import numpy as np
import torch


class TransferTimer:
    """Collects one duration per transferred batch: ``with timer.timing(device): ...``."""

    def __init__(self):
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.seconds: list[float] = []

    def timing(self, device: torch.device) -> "_Span":
        return _Span(self, torch.device(device))

    def _collect(self) -> None:
        still = []
        for start, end in self._pending:
            if end.query():
                self.seconds.append(start.elapsed_time(end) / 1000.0)
            else:
                still.append((start, end))
        self._pending = still

    def drain(self) -> list[float]:
        """Every duration measured so far (waits for copies still in flight), then resets."""
        for _, end in self._pending:
            end.synchronize()
        self._collect()
        out, self.seconds = self.seconds, []
        return out

    def summary(self) -> dict:
        """``h2d_mean_ms`` / ``h2d_p95_ms`` over the batches so far (None when nothing moved)."""
        seconds = self.drain()
        if not seconds:
            return {"h2d_mean_ms": None, "h2d_p95_ms": None}
        return {
            "h2d_mean_ms": round(1000 * float(np.mean(seconds)), 3),
            "h2d_p95_ms": round(1000 * float(np.percentile(seconds, 95)), 3),
        }


class _Span:
    def __init__(self, timer: TransferTimer, device: torch.device):
        self.timer, self.cuda = timer, device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()
            self.timer._pending.append((self.start, self.end))
            self.timer._collect()
        else:
            self.timer.seconds.append(time.perf_counter() - self.t0)
