"""A test-only Lightning callback, added through the config (`+callbacks.signal_at._target_=...`):
the training process sends itself a real signal after a given optimizer step."""

from __future__ import annotations

import os
import signal

import lightning as L


class SignalAtStep(L.Callback):
    def __init__(self, step: int, signal_name: str = "SIGTERM"):
        self.step, self.signum = step, getattr(signal, signal_name)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class KillWorkerAtStep(L.Callback):
    """SIGKILL one worker of the train loader after a given optimizer step (what the OOM
    killer does to a worker that outgrew its memory)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            pids = trainer.train_dataloader.worker_pids()
            assert pids, "the train loader has no workers to kill"
            os.kill(pids[0], signal.SIGKILL)
