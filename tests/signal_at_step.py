"""A test-only Lightning callback, added through the config (`+callbacks.signal_at._target_=...`):
the training process sends itself a real signal after a given optimizer step."""

from __future__ import annotations

import os
import shutil
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


class ResourceProbe(L.Callback):
    """At every train epoch's start, one JSON line in ``path``: the main process's open fds and
    RSS, the entries in /dev/shm and the bytes it holds (torch unlinks its segments at once, so
    the bytes of those still open show only there), and the pid and RSS of every live train and
    val worker."""

    def __init__(self, path: str, shm_path: str = "/dev/shm"):
        self.path, self.shm_path = path, shm_path

    def on_train_epoch_start(self, trainer, pl_module):
        import json

        import psutil

        def workers(loader) -> dict:
            out = {}
            for pid in loader.worker_pids() if hasattr(loader, "worker_pids") else []:
                try:
                    out[pid] = psutil.Process(pid).memory_info().rss
                except psutil.Error:
                    continue
            return out

        val = trainer.val_dataloaders
        row = {"epoch": trainer.current_epoch, "fds": len(os.listdir("/proc/self/fd")),
               "shm": len(os.listdir(self.shm_path)), "shm_used": shutil.disk_usage(self.shm_path).used,
               "rss": psutil.Process().memory_info().rss,
               "train_workers": workers(trainer.train_dataloader), "val_workers": workers(val) if val else {}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


class NonFiniteLossAt(L.Callback):
    """From optimizer step ``step``, for ``count`` steps, the detector's first loss term comes
    out NaN, on rank ``rank`` only (None: every rank): what an overflow does to one rank's
    forward pass."""

    def __init__(self, step: int, count: int = 1, rank: int | None = None):
        self.step, self.count, self.rank = step, count, rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        model = pl_module.model
        hit = self.step <= trainer.global_step < self.step + self.count
        hit = hit and (self.rank is None or trainer.global_rank == self.rank)
        if hit and "forward" not in vars(model):
            real = model.forward

            def forward(*args, **kwargs):
                losses = dict(real(*args, **kwargs))
                first = next(iter(losses))
                losses[first] = losses[first] * float("nan")
                return losses

            model.forward = forward
        elif not hit and "forward" in vars(model):
            del model.forward
