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


class KillGroupAtStep(L.Callback):
    """SIGKILL another process group (a test's server) after a given optimizer step."""

    def __init__(self, step: int, pgid: int):
        self.step, self.pgid = step, pgid

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.killpg(self.pgid, signal.SIGKILL)


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
    forward pass. ``first_micro_batch_only``: with gradient accumulation, only the first
    micro-batch of each such step (the others stay finite)."""

    def __init__(self, step: int, count: int = 1, rank: int | None = None, first_micro_batch_only: bool = False):
        self.step, self.count, self.rank, self.first_only = step, count, rank, first_micro_batch_only

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        model = pl_module.model
        hit = self.step <= trainer.global_step < self.step + self.count
        hit = hit and (self.rank is None or trainer.global_rank == self.rank)
        hit = hit and (not self.first_only or batch_idx % trainer.accumulate_grad_batches == 0)
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

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if "forward" in vars(pl_module.model):  # never into validation (an epoch may end inside a step)
            del pl_module.model.forward


class ParametersAcrossSteps(L.Callback):
    """For each optimizer step in ``steps``: how many parameters the step changed, on this rank,
    appended as one JSON line to ``<path>.rank<R>``. Snapshot at the step's first micro-batch,
    compared once the step is taken."""

    def __init__(self, path: str, steps: list[int]):
        self.path, self.steps, self.before = path, list(steps), {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = trainer.global_step
        if step in self.steps and step not in self.before:
            self.before[step] = {n: p.detach().clone() for n, p in pl_module.named_parameters()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import json

        import torch

        step = trainer.global_step - 1  # the step just taken
        before = self.before.get(step)
        if before is not None and step in self.steps:
            self.steps.remove(step)
            changed = [n for n, p in pl_module.named_parameters() if not torch.equal(p.detach(), before[n])]
            with open(f"{self.path}.rank{trainer.global_rank}", "a") as f:
                f.write(json.dumps({"step": step, "changed": len(changed), "of": len(before)}) + "\n")
