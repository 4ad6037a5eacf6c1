"""The train stream's ledger (design §5): where it stands, the digest of every batch the model
consumed, and which indices each epoch took, gathered across ranks under DDP.

Saved in every checkpoint (plain types only, so it loads with ``weights_only=True``), so that
a resumed run continues with exactly the remaining batches and its digest covers both parts.
"""

from __future__ import annotations

import numpy as np
import torch

from cocodet.loader.flat_batch import FlatBatch, chain_stream_digest
from cocodet.loader.stream_position import StreamPosition


class StreamLedger:
    """Position, digest and consumed indices of this rank's train stream.

    Args:
        batch_size, seed: what a saved position must match to continue exactly.
    """

    def __init__(
        self, batch_size: int, seed: int, group_aspect_ratio: int | None = None, partner_window: int | None = None
    ):
        self.batch_size, self.seed, self.group_aspect_ratio = batch_size, seed, group_aspect_ratio
        self.partner_window = partner_window
        self.position: StreamPosition | None = None
        self.digest = ""
        self.consumed: dict[int, list[np.ndarray]] = {}  # epoch -> the dataset indices the model took
        self.resume_pending = self.resume_next_epoch = False

    def start(self, world_size: int) -> StreamPosition:
        """The position, created at the first loader of a run that did not resume."""
        if self.position is None:
            self.position = StreamPosition(
                self.batch_size, self.seed, world_size, self.group_aspect_ratio, self.partner_window
            )
        return self.position

    def consume(self, batch: FlatBatch, epoch: int) -> None:
        """Advance by one batch (the model's input)."""
        if self.position is not None:
            self.position.advance(epoch)
        self.digest = chain_stream_digest(self.digest, batch)
        self.consumed.setdefault(epoch, []).append(batch.sample_keys[:, 1].numpy().copy())

    def state_dict(self, world_size: int, epoch_done: bool | None) -> dict:
        """For checkpoints; ``epoch_done``: saved after the epoch's last batch (Lightning then
        resumes at the next epoch)."""
        position = self.position.state_dict() if self.position is not None else None
        if position is not None and epoch_done is not None:
            position["epoch_done"] = epoch_done
        return {"stream_digest": self.digest, "stream_digests": self._all_digests(world_size), "position": position}

    def _all_digests(self, world_size: int) -> list[str]:
        """Every rank's digest (rank 0 alone writes the checkpoint). Lightning dumps a
        checkpoint on every rank and meets them at a barrier, so this gather is as safe."""
        if world_size <= 1 or not torch.distributed.is_initialized():
            return [self.digest]
        digests = [None] * world_size
        torch.distributed.all_gather_object(digests, self.digest)
        return digests

    def load_state_dict(self, state: dict, rank: int, world_size: int) -> None:
        """Restore what a checkpoint saved (before the train loader is built)."""
        if state.get("position"):
            self.position = StreamPosition(
                self.batch_size, self.seed, world_size, self.group_aspect_ratio, self.partner_window
            )
            self.position.load_state_dict(state["position"])  # refuses another rank count
            self.resume_pending = True
            self.resume_next_epoch = bool(state["position"].get("epoch_done"))
        digests = state.get("stream_digests") or [state.get("stream_digest", "")]
        self.digest = digests[rank] if rank < len(digests) else state.get("stream_digest", "")

    def take_resume_start(self, sampler) -> tuple[int, int] | None:
        """After a restore: stand ``sampler`` in the saved epoch and return where the loader
        begins ((epoch, batches); None: at the start of the next epoch). The resumed epoch's
        iterator is created before Lightning calls set_epoch, so this must happen first."""
        if not self.resume_pending:
            return None
        self.resume_pending = False
        if self.resume_next_epoch:
            sampler.set_epoch(self.position.epoch + 1)
            return None
        sampler.set_epoch(self.position.epoch)
        return (self.position.epoch, self.position.batches)

    def ddp_summary(self, world_size: int, train_images: int) -> dict:
        """What every rank consumed, gathered: per-rank stream digests, and over the epochs
        this run trained, how many train indices were taken, how many of them distinct, and
        how many were the sampler's padded repeats. Collective: every rank must call it."""
        mine = {"digest": self.digest, "consumed": {e: np.concatenate(a) for e, a in self.consumed.items()}}
        ranks = [mine]
        if world_size > 1:
            ranks = [None] * world_size
            torch.distributed.all_gather_object(ranks, mine)
        taken = unique = 0
        for epoch in sorted({e for r in ranks for e in r["consumed"]}):
            indices = np.concatenate([r["consumed"].get(epoch, np.empty(0, np.int64)) for r in ranks])
            taken, unique = taken + len(indices), unique + len(np.unique(indices))
        return {
            "world_size": world_size,
            "train_images": train_images,
            "train_consumed": taken,
            "train_unique": unique,
            "train_padded": taken - unique,
            "stream_digests": [r["digest"] for r in ranks],
        }
