"""One optimizer step's accumulation window (design §12): its micro-batches' verdicts and
samples, kept for the record of a skipped step, and the collective that makes each
micro-batch's verdict the same on every rank (``models/health.py`` keeps the run's bookkeeping).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Window:
    """The micro-batches of one optimizer step (``trainer.accumulate_grad_batches`` of them):
    the first non-finite one's terms, losses and samples, for the record of a skipped step.
    ``cause``: "loss" (a micro-batch's loss on some rank) or "gradients" (finite losses, but
    the step's gradients were not). ``targets``: each micro-batch's targets, kept by reference
    so that a gradient skip can name the window's samples (read on the host only then);
    ``losses`` holds the last micro-batch's terms until a non-finite one replaces them."""

    nonfinite: bool = False
    cause: str = ""
    terms: list[str] = field(default_factory=list)
    losses: dict[str, float] = field(default_factory=dict)
    samples: list = field(default_factory=list)
    targets: list = field(default_factory=list)

    def add(self, targets, losses: dict[str, float]) -> None:
        self.targets.append(targets)
        if not self.nonfinite:
            self.losses = losses

    def note(self, terms: list[str], losses: dict[str, float], samples: list) -> None:
        if not self.nonfinite:
            self.nonfinite, self.cause, self.terms, self.losses, self.samples = True, "loss", terms, losses, samples

    def note_gradients(self) -> None:
        if not self.nonfinite:
            self.nonfinite, self.cause = True, "gradients"
            self.samples = [key for targets in self.targets for key in sample_keys(targets)]


def sample_keys(targets) -> list[tuple]:
    """``(epoch, index, image_id)`` of each sample of a micro-batch (restored targets)."""
    return [(*(int(x) for x in t["sample_key"].tolist()), int(t["image_id"])) for t in targets]


def agree(flags: list[bool], device: torch.device) -> list[bool]:
    """Each flag true on any rank is true on every rank (one all-reduce, max); a single
    process returns them as they are."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return flags
    if torch.distributed.get_world_size() == 1:
        return flags
    tensor = torch.tensor([float(f) for f in flags], device=device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return [bool(v) for v in tensor.tolist()]
