"""mode=train: build the datamodule, the model and the Trainer, fit, and summarise the run
(design §2): the status a run ends with, its numbers (``modes/train_summary.py``), and the
tracker's end."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from cocodet.datasets.bad_samples import JSONL_NAME as BAD_SAMPLES_FILE
from cocodet.elastic.meeting import meet
from cocodet.errors import RunStopped, TrainingStopped, UnusableModel
from cocodet.inference.checkpoint import load_weights
from cocodet.loader.failures.diagnose import explained_loader_failures
from cocodet.loader.plan.records import LoaderPlan
from cocodet.models.checkpoint_file import load_checkpoint
from cocodet.models.checkpoint_io import nonfinite_tensors
from cocodet.models.checkpoint_store import abort_left_uploads
from cocodet.models.prediction_grid import PredictionGrid
from cocodet.models.preemption import PreemptionCheckpoint
from cocodet.models.zoo import seed_model_init
from cocodet.modes.last_run import resume_checkpoint
from cocodet.modes.train_summary import train_summary
from cocodet.modes.wiring import build_datamodule, build_module, build_trainer
from cocodet.ranks import Ranks
from cocodet.ranks_in_trainer import check_ranks, finish_ranks
from cocodet.run_spec.records import RunSpec
from cocodet.tracking.continued_logs import continue_logs
from cocodet.tracking.lightning_logger import CHECKPOINT_KEY
from cocodet.tracking.trainer_hooks import abort_tracking, close_tracking, prepare_tracking

log = logging.getLogger(__name__)


def train(spec: RunSpec, plan: LoaderPlan, resources) -> dict:
    weights_only, chosen = spec.weights_only, {}

    def choose() -> dict:
        if spec.ranks.global_rank == 0:  # what a writer killed mid-upload left in a bucket folder
            abort_left_uploads()
        path, chosen["checkpoint"] = resume_checkpoint(spec)
        return {"resume": path}

    # Under torchrun, rank 0 chooses and every rank of the attempt resumes that file (elastic/meeting.py).
    # Read once (refused in one line when untrusted, not a checkpoint, or not the bytes written):
    # the MLflow run id and step here, the weight check below, and Lightning's restore, handed
    # the same dict by the checkpoint writer (a checkpoint is 100-300 MB, maybe in a bucket).
    ckpt = meet(spec.ranks, choose)["resume"]
    resumed = chosen["checkpoint"] if "checkpoint" in chosen else load_checkpoint(ckpt, weights_only) if ckpt else {}
    resumed_run_id, resumed_step = resumed.get(CHECKPOINT_KEY), int(resumed.get("global_step") or 0)
    datamodule = build_datamodule(spec, plan)
    seed_model_init(spec.seed)
    module = build_module(spec, datamodule)
    if ckpt:  # another model's or dataset's weights: the one line mode=eval gives, before Lightning's traceback could
        load_weights(module, ckpt, weights_only, checkpoint=resumed)
    trainer = build_trainer(spec)
    if ckpt:
        trainer.strategy.checkpoint_io.hand_over(ckpt, resumed)
    del resumed  # the writer holds it until Lightning takes it
    if ckpt and spec.ranks.global_rank == 0:  # the CSV and TensorBoard records go on in their own folders
        continue_logs(trainer.loggers, resumed_step)
    prepare_tracking(trainer, spec.config, plan, resumed_run_id)
    return fit(
        trainer,
        module,
        datamodule,
        plan,
        ckpt_path=ckpt,
        weights_only=weights_only,
        shm_path=spec.loader.shm_path,
        ranks=spec.ranks,
    )


def fit(
    trainer: L.Trainer,
    module: L.LightningModule,
    datamodule: L.LightningDataModule,
    plan: LoaderPlan,
    *,
    ckpt_path: str | None,
    weights_only: bool,
    shm_path: str,
    ranks: Ranks | None = None,
) -> dict:
    """Train, validating as configured; return the training summary. ``ranks``: what
    ``cocodet.ranks`` answered before the trainer existed, checked against the trainer's."""
    started = time.perf_counter()
    try:
        with explained_loader_failures(plan, shm_path=shm_path):
            status, stopped = _run_fit(trainer, module, datamodule, ckpt_path, weights_only)
    except BaseException as e:  # an unexpected error, Ctrl-C: the MLflow run ends FAILED (KILLED)
        abort_tracking(trainer, e)
        raise
    # Collective (every rank gathers), so before anything only rank 0 does.
    ddp = datamodule.ddp_summary() if trainer.world_size > 1 else None
    if ddp is not None:
        ddp.update(val_images_evaluated=module.val_images_evaluated, val_repeats_removed=module.val_repeats_removed)
    checkpoints = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]
    preemption = next((c for c in trainer.callbacks if isinstance(c, PreemptionCheckpoint)), None)
    if status == "completed":
        stopped = unusable_end(trainer, module, saves_checkpoints=bool(checkpoints) or preemption is not None)
        status = stopped.status if stopped is not None else status
    if status in ("preempted", "interrupted"):
        report_preemption(trainer, preemption, status)
    rank_check = check_ranks(trainer, ranks) if ranks is not None else None
    finish_ranks(trainer)
    summary = train_summary(
        trainer,
        module,
        datamodule,
        plan,
        status=status,
        started=started,
        checkpoints=checkpoints,
        preemption=preemption,
        ddp=ddp,
        ranks=rank_check,
    )
    return finish(trainer, summary, stopped, plan)


def finish(trainer: L.Trainer, summary: dict, stopped: RunStopped | None, plan: LoaderPlan) -> dict:
    """The summary, after the tracker (logger=mlflow) recorded how the run ended; raised with
    the error that stopped the run, if one did."""
    if stopped is not None:
        stopped = with_summary(stopped, summary)
        summary = stopped.summary
    tracking = close_tracking(trainer, summary, plan, run_files(trainer))
    if tracking is not None:
        summary["mlflow"] = tracking
    if stopped is not None:
        raise stopped
    return summary


def _run_fit(
    trainer: L.Trainer, module, datamodule, ckpt_path: str | None, weights_only: bool
) -> tuple[str, RunStopped | None]:
    """``trainer.fit``, and how it ended: (status, the RunStopped that stopped it or None)."""
    try:
        trainer.fit(
            module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=weights_only if ckpt_path else None
        )
    except SIGTERMException:
        close_progress_bars(trainer)
        if any(getattr(c, "interrupted", False) for c in trainer.callbacks):  # Ctrl-C, taken as SIGTERM
            return "interrupted", None
        return "preempted", None
    except RunStopped as e:  # a full disk, a health stop: the summary still reaches stdout, then one error line
        close_progress_bars(trainer)
        return e.status, e
    finally:
        datamodule.teardown("fit")  # its threads (a remote root's read-ahead), also when the run failed
    return "completed", None


def run_files(trainer: L.Trainer) -> list[Path]:
    """The files a tracker keeps of a run: the last val_predictions.png and bad_samples.jsonl."""
    grids = [c.path for c in trainer.callbacks if isinstance(c, PredictionGrid)]
    return [*grids, Path(trainer.default_root_dir) / BAD_SAMPLES_FILE]


def with_summary(stopped: RunStopped, summary: dict) -> RunStopped:
    """The error that ended the run, carrying the summary so far (and, for a health stop, the
    checkpoint to go back to)."""
    if isinstance(stopped, TrainingStopped):
        stopped.args = (f"{stopped}; last checkpoint: {summary['last_ckpt'] or 'none was written before it'}",)
    stopped.summary = {**summary, "error": str(stopped)}
    return stopped


def report_preemption(trainer: L.Trainer, preemption: PreemptionCheckpoint | None, status: str = "preempted") -> None:
    """The log line and the resume command of a preempted (or interrupted) run."""
    saved = preemption.saved_path if preemption else None
    log.warning(
        "%s at step %d (epoch %d); %s",
        status,
        trainer.global_step,
        trainer.current_epoch,
        f"saved {saved}" if saved else "no checkpoint was written (no PreemptionCheckpoint callback)",
    )
    sys.stderr.write(
        f"{status} at step {trainer.global_step}: resume with the same command plus "
        f"ckpt_path=last hydra.run.dir={Path(trainer.default_root_dir).resolve()}\n"
    )


def close_progress_bars(trainer: L.Trainer) -> None:
    """Close the bars a SIGTERM left open: tqdm would otherwise redraw them at interpreter exit,
    after the summary, which must stay the last line on stdout (design §2)."""
    from tqdm import tqdm

    callback = trainer.progress_bar_callback
    for bar in list(vars(callback).values()) if callback is not None else []:
        if isinstance(bar, tqdm):
            bar.close()


def unusable_end(trainer: L.Trainer, module: L.LightningModule, saves_checkpoints: bool) -> UnusableModel | None:
    """A run that reached its end is ``completed`` only when the model it ends with is finite
    and, where checkpoints are configured, the newest state offered to them was written (a
    checkpoint with a non-finite tensor is refused: models/checkpoint_io.py). Otherwise the
    error that says so, naming the first non-finite tensor and the last good checkpoint."""
    io = trainer.strategy.checkpoint_io
    written, refused = getattr(io, "written", None), getattr(io, "refused", None)
    bad = nonfinite_tensors(module.state_dict())
    if not bad and not (saves_checkpoints and refused):
        return None
    good = (
        f"the last good checkpoint is {written[0]} (step {written[1]}): resume from it with ckpt_path={written[0]} "
        if written
        else "no checkpoint was written before it: start again "
    )
    advice = (
        "and a lower model.optimizer.lr or a longer warm-up (model.scheduler.pct_start); summary.health.skipped "
        "lists the steps skipped"
    )
    if bad:
        return UnusableModel(
            f"training ended with a model that is not finite: {_tensors(len(bad))}, the first "
            f"{bad[0]}, so it is not usable; {good}{advice}"
        )
    return UnusableModel(
        f"training ended, but its last checkpoint ({refused['path']}, step {refused['step']}) was not "
        f"written: {_tensors(len(refused['tensors']))} not finite, the first "
        f"{refused['tensors'][0]}; {good}{advice}"
    )


def _tensors(n: int) -> str:
    return f"{n} tensor" if n == 1 else f"{n} tensors"
