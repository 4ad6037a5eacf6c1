"""The figure a run hands back to Hydra: ``train()``'s return value, what a search optimises.

``optimized_metric`` names a numeric top-level key of the run's summary (``auto``: ``map50`` for
``mode=train`` and ``eval``, ``examples_per_s`` for ``mode=bench``, nothing for the other modes),
``optimized_direction`` whether more is better (``auto``: ``minimize`` for keys that are costs,
``maximize`` otherwise). A run that did not complete has no figure: inside a multirun it raises
:class:`TrialFailed` (the sweep records the trial as failed and goes on); a single run exits 2.
"""

from __future__ import annotations

import math

from cocodet.errors import UserError

AUTO_METRIC = {"train": "map50", "eval": "map50", "bench": "examples_per_s"}
# Summary keys where less is better; every other figure (mAP, throughput) is maximised.
COST_SUFFIXES = ("_ms", "_s", "_mb", "_bytes", "_fraction", "loss")


class TrialFailed(UserError):
    """A run inside a multirun that ended without its figure: ``reason`` in one line."""


def metric_name(mode: str, optimized_metric: str | None) -> str | None:
    """The summary key this run returns (None: this mode has no figure and none was named)."""
    if optimized_metric in (None, "auto"):
        return AUTO_METRIC.get(mode)
    return str(optimized_metric)


def direction(metric: str, optimized_direction: str | None) -> str:
    """``maximize`` or ``minimize`` for ``metric``: as declared, else from what the key measures."""
    if optimized_direction not in (None, "auto"):
        return str(optimized_direction)
    return "minimize" if metric.endswith(COST_SUFFIXES) else "maximize"


def figure(summary: dict, mode: str, optimized_metric: str | None) -> float | None:
    """The run's figure from its summary; raises TrialFailed (a UserError) when the run did not
    complete or the key holds no number, naming the numeric keys the summary does have."""
    metric = metric_name(mode, optimized_metric)
    status = summary.get("status", "completed")
    if status != "completed":
        failure = summary.get("failure") or summary.get("error")
        raise TrialFailed(f"the run ended {status}" + (f": {failure}" if failure else ""))
    if metric is None:
        return None
    value = summary.get(metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        numeric = sorted(k for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        raise TrialFailed(
            f"optimized_metric={metric}: the mode={mode} summary holds {value!r} there, not a finite "
            f"number; its numeric keys: {', '.join(numeric) or 'none'}"
        )
    return float(value)
