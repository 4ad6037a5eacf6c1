"""Training health (design §12): an optimizer step whose accumulation window held a
non-finite loss on any rank, or whose gradients are not finite, is skipped on every rank
(``models/skipped_step.py`` undoes what its forwards did), a run of them ends the run as diverged,
and a collapse (a loss term frozen at one value, or confident predictions that fell to none
after the warm-up) is named in a warning.

:class:`StepHealth` holds the bookkeeping of one run; the module calls it. It decides nothing
alone under DDP: each micro-batch's verdict is one small all-reduce (``[non-finite, stop]``,
max over ranks; it and the window's record are ``models/step_window.py``'s), and the optimizer
step is skipped when any micro-batch of its window was non-finite, so every rank skips the same
steps and stops at the same step. The gradient verdict needs no collective: it is read after
DDP's all-reduce, where every rank holds the same gradients.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field

from cocodet import schema
from cocodet.models.step_window import Window

log = logging.getLogger(__name__)

SKIP_LOG_LIMIT = 20  # skipped steps logged and kept in the summary; later ones only counted
# What the collapse study (docs/studies.md) found: FCOS's box outputs die behind their ReLU when
# bbox_reg starts at bias 0; EMA made no difference there, so it is not offered as a cure.
COLLAPSE_ADVICE = (
    "for FCOS keep model.detector.regression_bias=1.0 (at 0 every box starts as a point and the "
    "box outputs can die: docs/studies.md); else try a lower learning rate (model.optimizer.lr) or a "
    "longer warm-up (model.scheduler.pct_start)"
)


@dataclass
class HealthConfig:
    max_nonfinite_steps: int = 5  # skipped steps in a row before the run stops as diverged
    flat_steps: int = 50  # a loss term at one value (to flat_tolerance) this many steps: collapse
    flat_tolerance: float = 1e-6
    on_collapse: str = "warn"  # warn | stop
    score_threshold: float = 0.3  # a "confident" prediction (the prediction grid's threshold)

    def __post_init__(self):
        schema.check("model.health.on_collapse", self.on_collapse)
        schema.check("model.health.max_nonfinite_steps", self.max_nonfinite_steps)
        schema.check("model.health.flat_steps", self.flat_steps)


@dataclass
class FlatTerm:
    value: float
    since_step: int
    warned: bool = False


@dataclass
class StepHealth:
    config: HealthConfig
    consecutive: int = 0  # optimizer steps skipped in a row, now
    skipped: int = 0  # optimizer steps skipped in this run (a resume restores it)
    skipped_steps: list[dict] = field(default_factory=list)  # the first SKIP_LOG_LIMIT, for the summary
    recent: deque = field(default_factory=deque)  # the skips of the current run of them (the diverged message)
    amp_skipped: int = 0  # steps the fp16 GradScaler skipped on its own (GPU only)
    flat: dict[str, FlatTerm] = field(default_factory=dict)
    warnings: list[dict] = field(default_factory=list)
    confident_predictions: int | None = None  # at the last validation
    most_confident: int = 0  # the most confident predictions any validation of this run found
    stop_reason: str | None = None  # set on the step that must stop the run (collapse, stop mode)
    window: Window = field(default_factory=Window)  # the micro-batches since the last optimizer step
    last_step_skipped: bool = False  # the last optimizer step's verdict (the scheduler and EMA read it)

    # -- one training step ---------------------------------------------------------------
    def watch_flat_terms(self, losses: dict[str, float], step: int) -> None:
        """A term that stays within ``flat_tolerance`` of one value for ``flat_steps`` steps is
        a collapse (the case seen: FCOS's box-regression loss exactly 1.000 from step 9 on,
        and no boxes predicted)."""
        for name, value in losses.items():
            term = self.flat.get(name)
            if term is None or abs(value - term.value) > self.config.flat_tolerance:
                self.flat[name] = FlatTerm(value, step)
                continue
            if not term.warned and step - term.since_step + 1 >= self.config.flat_steps:
                term.warned = True
                self.warn(
                    "flat_loss",
                    name,
                    step,
                    f"loss term {name} has stayed at {term.value:.6f} (within {self.config.flat_tolerance:g}) "
                    f"for {step - term.since_step + 1} steps, from step {term.since_step} to step {step}: the "
                    "model has likely collapsed (it stops learning from that term); " + COLLAPSE_ADVICE,
                )

    def end_window(self, step: int, epoch: int, lr: float) -> bool:
        """The verdict of the optimizer step ``step``, over its whole accumulation window (the
        same on every rank: each micro-batch's verdict was agreed): skip it when any micro-batch
        was non-finite. Counts skips per optimizer step, and the steps in a row."""
        window, self.window = self.window, Window()
        self.last_step_skipped = window.nonfinite
        if window.nonfinite:
            self.record_skip(step, epoch, window.terms, window.losses, window.samples, lr, window.cause)
        else:
            self.consecutive = 0
            self.recent.clear()
        return window.nonfinite

    def amp_skip(self) -> None:
        """The fp16 GradScaler skipped the step on its own (inf gradients after scaling): not a
        health skip (the scaler's first steps calibrate its scale this way), but the model is
        restored and the schedule and EMA hold still all the same."""
        self.amp_skipped += 1
        self.last_step_skipped = True

    def record_skip(
        self,
        step: int,
        epoch: int,
        terms: list[str],
        losses: dict[str, float],
        keys: list,
        lr: float,
        cause: str = "loss",
    ):
        self.consecutive += 1
        self.skipped += 1
        # Non-finite values as words: the summary is strict JSON (NaN is not).
        shown = {k: (round(v, 6) if math.isfinite(v) else str(v)) for k, v in losses.items()}
        entry = {
            "step": step,
            "epoch": epoch,
            "cause": cause,
            "terms": terms,
            "losses": shown,
            "lr": lr,
            "samples": keys,
        }
        self.recent.append(entry)
        while len(self.recent) > self.config.max_nonfinite_steps:
            self.recent.popleft()
        if len(self.skipped_steps) < SKIP_LOG_LIMIT:
            self.skipped_steps.append(entry)
            what = (
                f"non-finite loss ({', '.join(terms) or 'on another rank'})"
                if cause == "loss"
                else "non-finite gradients from a finite loss"
            )
            log.warning(
                "step %d skipped on every rank: %s at learning rate %.3g; losses %s; samples (epoch, index, "
                "image_id) %s; the model's weights and buffers are as before the step",
                step,
                what,
                lr,
                shown,
                keys,
            )

    def diverged_message(self, lr: float) -> str:
        recent = list(self.recent)[-self.consecutive :]
        steps = [e["step"] for e in recent] or ["?"]
        terms = sorted({t for e in recent for t in e["terms"]}) or ["(another rank's)"]
        causes = {e.get("cause", "loss") for e in recent}
        what = {frozenset({"loss"}): "a non-finite loss", frozenset({"gradients"}): "non-finite gradients"}.get(
            frozenset(causes), "a non-finite loss or gradients"
        )
        return (
            f"training diverged: {self.consecutive} steps in a row had {what} "
            f"(terms {', '.join(terms)}; steps {steps[0]}-{steps[-1]}; learning rate {lr:.3g}), so each was "
            f"skipped and the run stopped at model.health.max_nonfinite_steps={self.config.max_nonfinite_steps} "
            "(no checkpoint holds a skipped step's weights). Try a lower model.optimizer.lr, a longer warm-up "
            "(model.scheduler.pct_start), trainer.gradient_clip_val, or precision 32-true if it was 16-mixed"
        )

    # -- one validation ------------------------------------------------------------------
    def watch_predictions(self, confident: int, step: int, warmup_end: int) -> None:
        """Warn when confident predictions fall to none after an earlier validation of this run
        found some (and the warm-up has ended). None from the start is not evidence: a detector
        trained from scratch predicts nothing confident in its first epochs, and a warning that
        fires on healthy runs is one users learn to ignore. A model that never learns is caught
        by its frozen loss terms (``watch_flat_terms``)."""
        self.confident_predictions = confident
        warned = any(w["kind"] == "no_predictions" for w in self.warnings)  # once a run: the log says when it began
        if confident == 0 and self.most_confident > 0 and step >= warmup_end and not warned:
            self.warn(
                "no_predictions",
                "predictions",
                step,
                f"validation at step {step} (after the warm-up, which ended at step {warmup_end}) found no "
                f"prediction scoring at least {self.config.score_threshold} with a box of 1 px or more, where "
                f"an earlier one found {self.most_confident}: the model has likely collapsed; " + COLLAPSE_ADVICE,
            )
        self.most_confident = max(self.most_confident, confident)

    def warn(self, kind: str, term: str, step: int, message: str) -> None:
        self.warnings.append({"kind": kind, "term": term, "step": step, "message": message})
        log.warning("collapse: %s", message)
        if self.config.on_collapse == "stop" and self.stop_reason is None:
            self.stop_reason = message

    # -- summary and checkpoint ----------------------------------------------------------
    def summary(self) -> dict:
        return {
            "skipped_nonfinite_steps": self.skipped,
            "skipped": self.skipped_steps,
            "amp_skipped_steps": self.amp_skipped,
            "confident_predictions": self.confident_predictions,
            "warnings": self.warnings,
        }

    def state_dict(self) -> dict:
        return {"skipped": self.skipped, "amp_skipped": self.amp_skipped, "most_confident": self.most_confident}

    def load_state_dict(self, state: dict) -> None:
        self.skipped, self.amp_skipped = int(state.get("skipped", 0)), int(state.get("amp_skipped", 0))
        self.most_confident = int(state.get("most_confident", 0))


def confident_count(detections: list[dict], threshold: float) -> int:
    """COCO results (``bbox`` x, y, w, h in the original frame) scoring at least ``threshold``
    with a box at least 1 px wide and high: FCOS keeps zero-area boxes, so a collapsed model
    can still score."""
    return sum(1 for d in detections if d["score"] >= threshold and d["bbox"][2] >= 1 and d["bbox"][3] >= 1)
