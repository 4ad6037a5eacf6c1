"""Where the train stream stands, and what a saved position must match to continue exactly
(design §5). Plain types only: it travels in checkpoints loaded with ``weights_only=True``."""

from __future__ import annotations

from cocodet.errors import UserError


class StreamPosition:
    """Where the train stream stands: epoch, batches consumed in it, and what must match to
    continue exactly (batch size, seed, rank count, aspect grouping, the partner window)."""

    def __init__(
        self,
        batch_size: int,
        seed: int,
        world_size: int,
        group_aspect_ratio: int | None = None,
        partner_window: int | None = None,
    ):
        self.epoch, self.batches = 0, 0
        self.batch_size, self.seed, self.world_size = batch_size, seed, world_size
        self.group_aspect_ratio = group_aspect_ratio  # grouped batches are other batches (loader/grouped_sampler.py)
        self.partner_window = partner_window  # window partners are other partners (data/dataset.py); None: no window

    def advance(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.batches = epoch, 0
        self.batches += 1

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "batches": self.batches,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "world_size": self.world_size,
            "group_aspect_ratio": self.group_aspect_ratio,
            "partner_window": self.partner_window,
        }

    def load_state_dict(self, state: dict) -> None:
        self.check(state)
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])

    def check(self, state: dict) -> None:
        """Refuse a saved position this run cannot continue exactly."""
        if state["world_size"] != self.world_size:
            raise ResumeError(
                f"the checkpoint was written by a run with {state['world_size']} rank(s) and this run has "
                f"{self.world_size}: each rank's share of every epoch depends on the rank count, so the "
                f"stream cannot continue exactly. Resume with {state['world_size']} rank(s) "
                "(trainer.devices x trainer.num_nodes)"
            )
        for key, name in (
            ("batch_size", "loader.batch_size"),
            ("seed", "seed"),
            ("group_aspect_ratio", "loader.group_aspect_ratio"),
            ("partner_window", "augment.partner_window"),
        ):
            # Checkpoints from before grouping (or windows) hold no key: ungrouped, no window (None).
            if state.get(key) != getattr(self, key):
                raise ResumeError(
                    f"the checkpoint's {name} is {state.get(key)} and this run's is {getattr(self, key)}: "
                    f"the remaining batches would differ. Resume with {_setting(name, state.get(key))}"
                )


def _setting(name: str, value) -> str:
    """The override that gives a saved value back (a window of None: partners not from a window)."""
    if name == "augment.partner_window" and value is None:
        return "the partners the checkpoint used (augment.partners=dataset, or augment.partner_pool=N)"
    return f"{name}={value if value is not None else 'null'}"


class ResumeError(UserError):
    """A checkpoint this run cannot continue exactly (another rank count, batch size or seed)."""
