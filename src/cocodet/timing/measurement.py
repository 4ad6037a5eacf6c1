"""The wait/work split (design §10), shared by ``mode=bench`` and the training callback.

Every step is split into *wait* (blocked in ``next(iterator)``) and *work* (the consumer,
CUDA-synchronised before the clock is read). Warm-up batches are discarded; examples/s is
counted from the examples actually returned and is the verdict. The wait fraction only says
where to look: it also falls when the work merely got slower.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _ms(x: float) -> float:
    return round(1000.0 * x, 3)


@dataclass
class Measurement:
    """Per-batch wait/work/examples across epochs, each epoch's first wait also kept apart.

    The one implementation of the wait/work statistics: ``mode=bench`` and the training
    callback both report through :meth:`report`, with the same keys.
    """

    waits: list[float] = field(default_factory=list)
    works: list[float] = field(default_factory=list)
    examples: list[int] = field(default_factory=list)
    epoch_starts: list[float] = field(default_factory=list)  # first-batch wait of each epoch

    def add(self, wait: float, work: float, examples: int, epoch_start: bool = False) -> None:
        if epoch_start:
            self.epoch_starts.append(wait)
        self.waits.append(wait)
        self.works.append(work)
        self.examples.append(examples)

    def report(self, warmup: int = 0) -> dict:
        """Figures over every batch after the first ``warmup`` ones, epoch starts included:
        across epochs, a start-up is part of what the loader sustains (on a small dataset
        it is most of it). ``examples_per_s`` counts the examples actually returned."""
        waits, works = np.array(self.waits[warmup:]), np.array(self.works[warmup:])
        if len(waits) == 0:
            raise ValueError(
                f"no batches left after discarding {warmup} warm-up batches; "
                f"measured {len(self.waits)} — raise bench.batches or lower bench.warmup"
            )
        examples = int(np.sum(self.examples[warmup:]))
        total = float(waits.sum() + works.sum())
        return {
            "examples_per_s": round(examples / total, 3) if total > 0 else float("inf"),
            "wait_mean_ms": _ms(waits.mean()),
            "wait_p50_ms": _ms(np.percentile(waits, 50)),
            "wait_p95_ms": _ms(np.percentile(waits, 95)),
            "wait_max_ms": _ms(waits.max()),
            "work_mean_ms": _ms(works.mean()),
            "step_mean_ms": _ms((waits + works).mean()),
            "wait_fraction": round(float(waits.sum() / total), 4) if total > 0 else 0.0,
            "first_batch_s": round(self.epoch_starts[0], 4) if self.epoch_starts else None,
            "epoch_start_s": [round(x, 4) for x in self.epoch_starts],
            "batches": len(self.waits),
            "measured_batches": len(waits),
            "examples": examples,
        }
