"""The detector LightningModule: torchvision model, its training steps (the health check's skips and
stops), schedule and checkpoint state; its validation is ``models/validation.py``'s."""

from __future__ import annotations

import logging
import math
from functools import partial

import lightning as L
import torch

from cocodet import schema
from cocodet.errors import TrainingStopped
from cocodet.models.evaluation import DEFAULT_BACKEND
from cocodet.models.health import HealthConfig, StepHealth
from cocodet.models.skipped_step import BufferSnapshot, drop_gradients, gradient_norm, gradients_finite
from cocodet.models.step_window import agree, sample_keys
from cocodet.models.validation import CocoValidation

log = logging.getLogger(__name__)

RUN_CONFIG_KEY = "cocodet_config"  # a checkpoint's copy of the groups its run was built from (plain values)


class DetectorModule(CocoValidation, L.LightningModule):
    """Trains a torchvision detector on restored batches ``(images, targets)``.

    Args:
        detector: a partial (Hydra ``_partial_: true``) of :func:`cocodet.models.zoo.build_detector`
            taking ``num_classes`` and ``image_size``.
        image_size: the letterboxed input side the detector is built for.
        optimizer: a partial taking the parameters (Hydra ``_partial_: true``).
        scheduler: optional partial taking the optimizer; ``total_steps``/``T_max`` are filled
            from the trainer when the scheduler takes them and the config left them out.
        scheduler_interval: "step" or "epoch".
        val_ann_file: COCO ground truth for COCOeval.
        category_ids: original COCO category id of each contiguous label 1..K.
        eval_max_images: evaluate only the first N validation images (quick checks; the rest of
            the val batches are skipped without a forward pass). None: all.
        eval_backend: the COCOeval implementation, "faster" or "pycocotools" (equal to 1e-4).
        health: :class:`~cocodet.models.health.HealthConfig` keys (non-finite steps, collapse).
        ema: ``{"decay": float | None}``: EMA weights for validation and checkpoints, or off.
        loader_resizes: the loader resizes as the model's transform would (the reference
            presets, ``zoo.LoaderSizedTransform``).
        lr_scaling: ``{"reference_lr", "reference_batch"}``: the optimizer's rate is the
            reference's, scaled linearly to this run's global batch (devices x nodes x
            loader.batch_size x accumulate_grad_batches, resolved at run time). None: the
            optimizer's ``lr`` as configured.
    """

    def __init__(
        self,
        detector: partial,
        image_size: int,
        optimizer: partial,
        val_ann_file: str,
        category_ids: list[int],
        scheduler: partial | None = None,
        scheduler_interval: str = "step",
        eval_max_images: int | None = None,
        eval_backend: str = DEFAULT_BACKEND,
        health: dict | None = None,
        ema: dict | None = None,
        loader_resizes: bool = False,
        lr_scaling: dict | None = None,
    ):
        super().__init__()
        # The dataset, model and augment groups this run was built from (plain values; set by the
        # wiring, which has them): kept in every checkpoint under RUN_CONFIG_KEY, so that
        # mode=eval|predict|export can read them back (run_spec/read.py).
        self.run_config: dict | None = None
        self.model = detector(num_classes=len(category_ids) + 1, image_size=image_size, loader_resizes=loader_resizes)
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.scheduler_interval = scheduler_interval
        self.init_validation(val_ann_file, category_ids, eval_max_images, eval_backend)
        self._resume_position: int | None = None
        self.health = StepHealth(HealthConfig(**dict(health or {})))
        self.ema_decay = schema.check("model.ema.decay", dict(ema or {}).get("decay"))
        self._window_buffers: BufferSnapshot | None = None  # the model's buffers when this step's window opened
        self._window_open = False
        self.lr_scaling = dict(lr_scaling) if lr_scaling else None
        self.lr_record: dict = {}  # global_batch and effective_lr, for summary.json
        self._warmup_end = 0  # set where the schedule is built

    def configure_callbacks(self):
        if self.ema_decay is None:
            return []
        from cocodet.models.ema import EMAWeights

        return [EMAWeights(self.ema_decay)]

    def forward(self, images):
        return self.model(images)

    def training_step(self, batch, batch_idx):
        images, targets = batch
        losses = self.model(images, targets)
        loss = sum(losses.values())
        # One host sync for every term (the skip needs the values on the host anyway).
        values = dict(zip(losses, torch.stack([v.detach().float() for v in losses.values()]).tolist()))
        bad = [name for name, v in values.items() if not math.isfinite(v)]
        if not bad:
            self.health.watch_flat_terms(values, self.global_step)
        # Every rank takes the same decision, or DDP's next gradient all-reduce would hang. The
        # micro-batch's verdict joins its optimizer step's window: with gradient accumulation a
        # non-finite micro-batch stays in .grad, so the step is decided over the whole window
        # (on_before_optimizer_step).
        nonfinite, stop = agree([bool(bad), self.health.stop_reason is not None], self.device)
        if nonfinite:
            self.health.window.note(bad, values, sample_keys(targets))
        else:
            self.health.window.add(targets, values)
            bs = len(images)
            self.log_dict({f"train/{k}": v.detach() for k, v in losses.items()}, batch_size=bs)
            self.log("train/loss", loss.detach(), prog_bar=True, batch_size=bs)
        if stop:
            raise TrainingStopped(
                self.health.stop_reason
                or "collapse found on another rank (its log has the warning); model.health.on_collapse=stop",
                "collapsed",
            )
        return loss

    def learning_rate(self) -> float:
        return float(self.trainer.optimizers[0].param_groups[0]["lr"]) if self.trainer.optimizers else float("nan")

    def on_train_start(self) -> None:
        if self._resume_position is not None:
            for config in self.trainer.lr_scheduler_configs:
                config.scheduler.last_epoch = self._resume_position
            self._resume_position = None
        # Allocated once, on the device and after DDP's set-up: the buffers a forward updates.
        self._window_buffers = BufferSnapshot(self.model)

    def on_train_batch_start(self, batch, batch_idx) -> None:
        if not self._window_open:  # the first micro-batch of an optimizer step: before its forward
            self._window_buffers.take()
            self._window_open = True

    def _scaler(self):
        return getattr(self.trainer.precision_plugin, "scaler", None)

    def on_before_optimizer_step(self, optimizer) -> None:
        """After the window's last backward (and fp16 unscaling), before clipping and the step:
        once per optimizer step. The step is skipped when its window held a non-finite
        micro-batch on any rank, or (without the fp16 scaler, which judges them itself) when
        its gradients are not finite: a finite loss whose backward overflowed. The gradients
        are read after DDP's all-reduce, so every rank reaches the same verdict."""
        from lightning.pytorch.plugins.precision.amp import _optimizer_handles_unscaling

        scaler = self._scaler()
        logged = self.global_step % max(1, self.trainer.log_every_n_steps) == 0  # the logging cadence
        # The verdict's norm is also the logged one; under the fp16 scaler (which judges the
        # gradients itself) it is computed at the logging cadence only.
        norm = gradient_norm(optimizer) if scaler is None or logged else None
        if scaler is None and not self.health.window.nonfinite and not gradients_finite(norm):
            self.health.window.note_gradients()
        lr = self.learning_rate()
        if self.health.end_window(self.global_step, self.current_epoch, lr):
            drop_gradients(
                optimizer, unscaled_by_the_optimizer=scaler is not None and _optimizer_handles_unscaling(optimizer)
            )
            if self.health.consecutive >= self.health.config.max_nonfinite_steps:
                self._window_buffers.restore()  # the checkpoint this stop may write holds the last good state
                raise TrainingStopped(self.health.diverged_message(lr), "diverged")
            return
        if logged and norm is not None:
            self.log("train/grad_norm", norm, batch_size=1)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        """The step (its closure runs the window's last micro-batch and the hook above), then
        what a skipped step must undo: its forwards' buffer updates (BatchNorm's running
        statistics and counters), before the EMA and the checkpoints read them. The fp16
        GradScaler skips a step on its own when it finds inf gradients and lowers its scale:
        that skip is undone too, and counted apart (``amp_skipped_steps``)."""
        scaler = self._scaler()
        before = scale_tensor(scaler)  # a copy on the scale's device: no host sync
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        # The scaler lowers its scale exactly when it skipped the step: one host read per step
        if before is not None and not self.health.last_step_skipped and bool(scale_tensor(scaler) < before):
            self.health.amp_skip()
        if self.health.last_step_skipped:
            self._window_buffers.restore()
        self._window_open = False

    def lr_scheduler_step(self, scheduler, metric) -> None:
        # The schedule follows the steps taken: a skipped step does not advance it.
        if self.health.last_step_skipped and self.scheduler_interval == "step":
            return
        scheduler.step() if metric is None else scheduler.step(metric)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["cocodet_health"] = self.health.state_dict()
        if self.run_config is not None:
            checkpoint[RUN_CONFIG_KEY] = self.run_config

    def warmup_end(self) -> int:
        """The optimizer step at which the schedule's warm-up ends (0 without a schedule)."""
        return self._warmup_end

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # A schedule sized to the run's length (OneCycle total_steps, cosine T_max) is rebuilt for
        # this run's length and fast-forwarded, so a resumed run may also train longer than the
        # one that saved it; restoring the old state would end the schedule early and raise.
        self.health.load_state_dict(checkpoint.get("cocodet_health") or {})
        states = checkpoint.get("lr_schedulers") or []
        if any("total_steps" in st or "T_max" in st for st in states):
            # Skipped steps (the health check's and the fp16 scaler's) did not advance the
            # schedule (lr_scheduler_step), nor do they here.
            taken = checkpoint["global_step"] - self.health.skipped - self.health.amp_skipped
            step = taken if self.scheduler_interval == "step" else checkpoint["epoch"]
            self._resume_position = int(step)
            checkpoint["lr_schedulers"] = []

    def configure_optimizers(self):
        from cocodet.models.optimization import build_optimization

        params = [p for p in self.parameters() if p.requires_grad]
        built = build_optimization(
            params,
            self.optimizer_factory,
            self.scheduler_factory,
            self.scheduler_interval,
            self._trainer,
            self.lr_scaling,
        )
        self.lr_record, self._warmup_end = built.record, built.warmup_end
        if built.scheduler is None:
            return built.optimizer
        return {
            "optimizer": built.optimizer,
            "lr_scheduler": {"scheduler": built.scheduler, "interval": self.scheduler_interval},
        }


def scale_tensor(scaler) -> torch.Tensor | None:
    """The fp16 GradScaler's scale as a tensor on its device, copied (None without a scaler).
    Before its first ``scale()`` the scaler holds no tensor yet: its initial scale, on the CPU."""
    if scaler is None:
        return None
    scale = getattr(scaler, "_scale", None)
    return scale.detach().clone() if scale is not None else torch.tensor(float(scaler.get_scale()))
