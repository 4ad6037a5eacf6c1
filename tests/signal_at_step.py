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
        row = {
            "epoch": trainer.current_epoch,
            "fds": len(os.listdir("/proc/self/fd")),
            "shm": len(os.listdir(self.shm_path)),
            "shm_used": shutil.disk_usage(self.shm_path).used,
            "rss": psutil.Process().memory_info().rss,
            "train_workers": workers(trainer.train_dataloader),
            "val_workers": workers(val) if val else {},
        }
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


class _AtSteps(L.Callback):
    """A fault installed for the micro-batches of optimizer steps ``step`` .. ``step+count-1``
    on rank ``rank`` (None: every rank), removed after each batch (never into validation).
    ``first_micro_batch_only``: with gradient accumulation, only each such step's first."""

    def __init__(self, step: int, count: int = 1, rank: int | None = None, first_micro_batch_only: bool = False):
        self.step, self.count, self.rank, self.first_only = step, count, rank, first_micro_batch_only
        self.handles = []

    def hit(self, trainer, batch_idx) -> bool:
        return (
            self.step <= trainer.global_step < self.step + self.count
            and (self.rank is None or trainer.global_rank == self.rank)
            and (not self.first_only or batch_idx % trainer.accumulate_grad_batches == 0)
        )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.hit(trainer, batch_idx):
            self.handles = self.install(pl_module.model)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        for handle in self.handles:
            handle.remove()
        self.handles = []


class NonFiniteForwardAt(_AtSteps):
    """The input of the model's first convolution is NaN (a forward pre-hook): every layer
    after it, BatchNorm's running statistics included, sees NaN, as after an fp16 overflow in
    a forward on a GPU."""

    def install(self, model):
        import torch

        first = next(m for m in model.backbone.modules() if isinstance(m, torch.nn.Conv2d))
        return [first.register_forward_pre_hook(lambda module, args: (args[0] * float("nan"), *args[1:]))]


class NonFiniteGradientAt(_AtSteps):
    """The loss stays finite; the gradient reaching the last parameter of the model is NaN (a
    backward hook): what a square root at 0 or a vanishing area does in a backward pass."""

    def install(self, model):
        last = [p for p in model.parameters() if p.requires_grad][-1]
        return [last.register_hook(lambda grad: grad * float("nan"))]


class OverflowAt(_AtSteps):
    """A finite loss scaled by 1e30: finite in fp32, but its fp16 gradients overflow once the
    GradScaler multiplies it by its scale, so the scaler skips the step and backs off."""

    def install(self, model):
        def scaled(module, args, losses):
            return {k: v.float() * 1e30 for k, v in losses.items()} if isinstance(losses, dict) else losses

        return [model.register_forward_hook(scaled)]


class PoisonBufferAt(L.Callback):
    """After optimizer step ``step``, outside any verdict, the first BatchNorm's running
    variance is set to NaN: a model that ends non-finite by a route the step checks cannot see."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            name, buffer = next((n, b) for n, b in pl_module.model.named_buffers() if n.endswith("running_var"))
            buffer.fill_(float("nan"))


class StateAcrossSteps(L.Callback):
    """For each optimizer step in ``steps``: the parameters and buffers the step changed, bit
    for bit (NaN counts as changed), on this rank, one JSON line to ``<path>.rank<R>``, with the
    fp16 scale before and after where there is a scaler. Snapshot at the step's first
    micro-batch, compared once the step is taken (after the module's own batch-end work: this
    runs at the next batch start or the epoch end)."""

    def __init__(self, path: str, steps: list[int]):
        self.path, self.steps, self.before, self.pending = path, list(steps), {}, None

    def state(self, trainer, pl_module) -> dict:
        from lightning.pytorch.callbacks.weight_averaging import WeightAveraging

        scaler = getattr(trainer.precision_plugin, "scaler", None)
        averaging = next((c for c in trainer.callbacks if isinstance(c, WeightAveraging)), None)
        average = getattr(averaging, "_average_model", None)  # Lightning's AveragedModel (model.ema.decay)
        return {
            "params": {n: p.detach().clone() for n, p in pl_module.named_parameters()},
            "buffers": {n: b.detach().clone() for n, b in pl_module.named_buffers()},
            "ema": {n: t.detach().clone() for n, t in average.state_dict().items()} if average is not None else {},
            "scale": float(scaler.get_scale()) if scaler is not None else None,
        }

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.compare(trainer, pl_module)
        step = trainer.global_step
        if step in self.steps and step not in self.before:
            self.before[step] = self.state(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step - 1  # the step just taken, if this batch took one
        if step in self.before and step in self.steps:
            self.pending = step

    def on_train_epoch_end(self, trainer, pl_module):
        self.compare(trainer, pl_module)

    def compare(self, trainer, pl_module) -> None:
        import json

        import torch

        if self.pending is None:
            return
        step, self.pending = self.pending, None
        self.steps.remove(step)
        before, after = self.before[step], self.state(trainer, pl_module)
        changed = {
            kind: [n for n, t in after[kind].items() if not torch.equal(t, before[kind][n])]
            for kind in ("params", "buffers", "ema")
        }
        finite = all(
            bool(torch.isfinite(t).all())
            for kind in ("params", "buffers")
            for t in after[kind].values()
            if t.is_floating_point()
        )
        row = {
            "step": step,
            "params_changed": len(changed["params"]),
            "params": len(after["params"]),
            "buffers_changed": changed["buffers"][:5],
            "n_buffers_changed": len(changed["buffers"]),
            "ema_changed": len(changed["ema"]),
            "ema": len(after["ema"]),
            "finite": finite,
            "scale_before": before["scale"],
            "scale_after": after["scale"],
        }
        with open(f"{self.path}.rank{trainer.global_rank}", "a") as f:
            f.write(json.dumps(row) + "\n")


class PauseAtStep(L.Callback):
    """After optimizer step ``step``, wait until the file ``until`` exists (at most ``seconds``):
    a run made to outlast an outage that the test ends by creating the file."""

    def __init__(self, step: int, seconds: float, until: str | None = None):
        self.step, self.seconds, self.until = step, seconds, until

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            import time

            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline and not (self.until and os.path.exists(self.until)):
                time.sleep(0.1)


class SignalGroupAtStep(L.Callback):
    """Send a signal to this process's whole group after a given optimizer step, as a terminal's
    Ctrl-C does: the main process and its DataLoader workers (run train.py in a session of its
    own, so the group is the run's alone)."""

    def __init__(self, step: int, signal_name: str = "SIGINT"):
        self.step, self.signum = step, getattr(signal, signal_name)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.killpg(os.getpgid(0), self.signum)


class KillNodeOnceAtStep(L.Callback):
    """SIGKILL the trainer started by the torchrun agent the test named ``node``
    (``COCODET_TEST_NODE``), its loader workers first, at a given optimizer step
    (``when``: "end" after the step's batch-end hooks, checkpoint included; "start" as the
    batch begins), once per run: the file ``marker`` says it happened, so the restarted
    attempt, which passes that step again, trains on. What a lost node does to a group.
    ``agent``: torchrun's agent too (a lost pod), so only a new agent can take the node's place."""

    def __init__(self, step: int, node: str, marker: str, when: str = "end", agent: bool = False):
        self.step, self.node, self.marker, self.when, self.agent = step, str(node), marker, when, agent

    def _kill(self, trainer):
        here = os.environ.get("COCODET_TEST_NODE")  # the test's name for this agent (ranks follow the rendezvous)
        if trainer.global_step != self.step or here != self.node or os.path.exists(self.marker):
            return
        open(self.marker, "w").close()
        if self.agent:  # the whole node: torchrun's agent (this process's parent) first, so it restarts nothing
            os.kill(os.getppid(), signal.SIGKILL)
        loader = trainer.train_dataloader
        for pid in loader.worker_pids() if hasattr(loader, "worker_pids") else []:
            os.kill(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.when == "start":
            self._kill(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.when == "end":
            self._kill(trainer)


class SigtermRecord(L.Callback):
    """Each rank's own record of SIGTERM, one JSON line per event in ``<path>.node<N>`` (N: the
    test's name for this rank's agent, ``COCODET_TEST_NODE``): every train batch's start and end,
    and the batch in progress when the signal arrived (a handler wrapped around the run's own;
    ``ended``: that batch's end hooks had finished). ``hold``: {"node<N>": [hook, batch]}, where
    that node's rank waits until it has heard SIGTERM (at most ``hold_s``), in the "start" or
    "end" hook of that train batch, after the run's own hooks of it (their collectives included)."""

    def __init__(self, path: str, hold: dict | None = None, hold_s: float = 300.0):
        self.path, self.hold_s = path, hold_s
        self.node = os.environ.get("COCODET_TEST_NODE")
        self.hold = tuple((hold or {}).get(f"node{self.node}", ())) or None
        self.batch, self.ended, self.heard = None, False, False
        self._previous = None

    def _write(self, **row) -> None:
        import json

        with open(f"{self.path}.node{self.node}", "a") as f:
            f.write(json.dumps(row) + "\n")

    def _on_sigterm(self, signum, frame) -> None:
        self._write(heard=self.batch, ended=self.ended)
        self.heard = True
        if callable(self._previous):
            self._previous(signum, frame)

    def _hold(self, hook: str, batch_idx: int) -> None:
        if self.hold == (hook, batch_idx):
            import time

            self._write(holding=batch_idx, hook=hook)
            deadline = time.monotonic() + self.hold_s
            while not self.heard and time.monotonic() < deadline:
                time.sleep(0.05)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._previous is None:  # every callback's on_train_start has run: the run's own handler is in place
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self.batch, self.ended = batch_idx, False
        self._write(start=batch_idx)
        self._hold("start", batch_idx)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._hold("end", batch_idx)
        self.ended = True
        self._write(end=batch_idx)


class RisingValMap(L.Callback):
    """``val/map`` as the checkpoint callbacks read it rises by 0.01 each epoch (they run after
    every other callback): each validation saves a new best, as a model that learns does."""

    def on_validation_end(self, trainer, pl_module):
        import torch

        if not trainer.sanity_checking:
            trainer.callback_metrics["val/map"] = torch.tensor(0.01 * (trainer.current_epoch + 1))
