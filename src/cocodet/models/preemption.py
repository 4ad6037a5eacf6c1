"""Preemption: on SIGTERM (spot hosts, SLURM), save a mid-epoch checkpoint at the next batch
boundary, then let Lightning end the run; and ``ckpt_path=last`` to find it again. The first
Ctrl-C (SIGINT) is taken the same way (the run ends ``interrupted``, exit status 130); a second
one stops at once.

Lightning's own SIGTERM notifier sets ``trainer.received_sigterm`` and raises
``SIGTERMException`` after the current batch's hooks; this callback writes the checkpoint in
that window (``on_train_batch_end``), so nothing trained is lost and the datamodule's
position (design §5) makes the resumed run consume exactly the remaining batches. SLURM's
requeue signal goes through Lightning's SLURM environment (``auto_requeue``), which saves
its own ``hpc_ckpt_*.ckpt`` in the run directory; ``ckpt_path=last`` finds those too.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import lightning as L

from cocodet.models.checkpoint_store import CheckpointStoreDown
from cocodet.ranks import elastic_launch
from cocodet.storage.errors import StoreDown
from cocodet.storage.urls import is_remote, join

log = logging.getLogger(__name__)


class PreemptionCheckpoint(L.Callback):
    """Writes ``<dirpath>/resume.ckpt`` when the process received SIGTERM, and every
    ``every_n_steps`` training steps (0: only on SIGTERM), so a hard kill loses at most that
    many. Writes are atomic: Lightning saves through an fsspec transaction (a temporary file
    renamed into place), so a kill during a save leaves the previous file whole.

    A file of its own, apart from ModelCheckpoint's ``last.ckpt``: two callbacks writing one
    name make Lightning version the second (``last-v1.ckpt``).
    """

    FILENAME = "resume.ckpt"

    def __init__(self, dirpath: str, every_n_steps: int | str = 0):
        self.dirpath, self.setting = str(dirpath), every_n_steps  # a folder or a bucket folder (checkpoint.dir)
        self.every_n_steps = 0 if every_n_steps == "auto" else int(every_n_steps)  # "auto": decided in setup
        self.saved_path: str | None = None
        self.preempted = False
        self.interrupted = False  # a Ctrl-C, taken as SIGTERM
        self._sigint = None  # the SIGINT handler before the run's own (restored when it ends)
        self._sigterm = None  # several ranks: the SIGTERM handler before ours (restored when it ends)
        self.sigterm_noted = False  # several ranks: this rank received SIGTERM; the ranks agree at a batch end
        self._launcher = None

    def setup(self, trainer, pl_module, stage):
        if self.setting == "auto":
            self.every_n_steps, why = auto_every_n_steps(trainer.num_nodes)
            log.info("checkpoint.every_n_steps=auto: %s", why)

    @property
    def path(self) -> str:
        return join(self.dirpath, self.FILENAME)

    def _save(self, trainer: L.Trainer) -> None:
        path = self.path
        trainer.save_checkpoint(path, weights_only=False)  # the whole state: optimizer, loops, stream position
        self.saved_path = str(path)

    def on_train_start(self, trainer, pl_module):
        """Take the first Ctrl-C as a SIGTERM, through Lightning's own SIGTERM path (registered
        by now): the step in progress ends, resume.ckpt is written at its boundary, and the run
        ends ``interrupted``. The default handler is back at once, so a second Ctrl-C raises
        KeyboardInterrupt wherever the run is."""
        if self._sigint is None:
            self._sigint = signal.signal(signal.SIGINT, self._first_interrupt)
        if trainer.world_size > 1 and self._sigterm is None:
            # Lightning's own handler broadcasts from inside the signal handler, wherever each rank
            # happens to be: ranks signalled at different points pair that broadcast with another
            # collective and the group hangs (a preempted cluster's two nodes, killed 30 s later
            # with no summary). Ours only notes the signal; the ranks agree at a batch end.
            self._launcher = trainer.strategy.launcher
            self._sigterm = signal.signal(signal.SIGTERM, self._note_sigterm)

    def _note_sigterm(self, signum, frame) -> None:
        if not self.sigterm_noted and self._launcher is not None:  # Lightning's launcher: its ranks hear it too
            self._launcher.kill(signum)
        self.sigterm_noted = True

    def _first_interrupt(self, signum, frame) -> None:
        self.interrupted = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log.warning(
            "Ctrl-C: the run stops after this step, saving %s (Ctrl-C again stops at once, without it)", self.path
        )
        os.kill(os.getpid(), signal.SIGTERM)

    def teardown(self, trainer, pl_module, stage):
        if self._sigint is not None:
            signal.signal(signal.SIGINT, self._sigint)
            self._sigint = None
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._sigterm is not None and self._any_rank_signalled(trainer):
            trainer._signal_connector.received_sigterm = True  # every rank: Lightning stops after this batch
        if trainer.received_sigterm:
            self._save_on_sigterm(trainer)
        elif self.every_n_steps and trainer.global_step % self.every_n_steps == 0:
            self._save(trainer)

    def _any_rank_signalled(self, trainer) -> bool:
        """Whether any rank received SIGTERM: one collective per step (a one-element all-reduce),
        at the same batch on every rank, so all of them save and stop together."""
        import torch
        import torch.distributed as dist

        noted = torch.tensor([1.0 if self.sigterm_noted else 0.0], device=trainer.strategy.root_device)
        dist.all_reduce(noted, op=dist.ReduceOp.MAX)
        return bool(noted.item())

    def on_exception(self, trainer, pl_module, exception):
        if trainer.received_sigterm:  # during validation, or after this hook in the batch: the position is exact
            self._save_on_sigterm(trainer)
        elif isinstance(exception, StoreDown) and not isinstance(exception, CheckpointStoreDown) and not self.preempted:
            # the dataset's store is down (the checkpoint folder's answers): the stream stands after the last batch
            self.preempted = True
            self._save(trainer)
            log.warning(
                "the store is down: saved %s at step %d (epoch %d)",
                self.saved_path,
                trainer.global_step,
                trainer.current_epoch,
            )

    def _save_on_sigterm(self, trainer: L.Trainer) -> None:
        if not self.preempted:
            self.preempted = True
            self._save(trainer)
            log.warning(
                "%s: saved %s at step %d (epoch %d)",
                "Ctrl-C" if self.interrupted else "SIGTERM",
                self.saved_path,
                trainer.global_step,
                trainer.current_epoch,
            )


# checkpoint.every_n_steps=auto where a run can lose a node or be restarted. A resume point costs
# one save (rank 0 writes; the others wait at the next collective): fasterrcnn_resnet50_fpn with
# SGD's momentum is 319 MiB, 0.73 s to a local disk (benchmarks/checkpoint_cost.py), an estimated
# 1-3 s to a network volume at 100-300 MB/s. A lost node costs the steps since the last point, on
# every node, plus the restart (about a minute of start-up). At 0.25 s a step (the torchvision
# reference's R50-FPN on 8 GPUs), 500 steps are about 2 minutes of the whole group at most, for
# 1-2% of the time in saves (docs/design.md §7.4).
AUTO_STEPS = 500


def auto_every_n_steps(num_nodes: int) -> tuple[int, str]:
    """(steps between resume points, why) for ``checkpoint.every_n_steps=auto``: AUTO_STEPS
    on several nodes or under torchrun restarts, else 0 (epoch ends and SIGTERM only)."""
    restarts = elastic_launch().max_restarts
    if num_nodes > 1 or restarts:
        where = f"{num_nodes} nodes" if num_nodes > 1 else f"torchrun --max-restarts={restarts}"
        return AUTO_STEPS, f"resume.ckpt every {AUTO_STEPS} steps ({where}: a lost node costs at most that many)"
    return 0, "resume.ckpt on SIGTERM only (one node, no restarts); last.ckpt at every epoch end"


def checkpoints_in_run(run_dir: Path) -> list[Path]:
    """The checkpoints a run wrote in its folder ``run_dir`` (its ``checkpoints/`` and SLURM's
    ``hpc_ckpt_*``)."""
    return [*run_dir.glob("checkpoints/*.ckpt"), *run_dir.glob("hpc_ckpt_*.ckpt")]


def run_of(checkpoint: Path) -> Path:
    """The run folder a checkpoint belongs to: ``<run>/checkpoints/x.ckpt`` or ``<run>/hpc_ckpt_N.ckpt``."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent


def checkpoints_under(outputs_root: Path) -> list[Path]:
    """Every checkpoint of every run under ``outputs_root`` (``ckpt_path=last`` picks among them,
    ``modes/last_run.py``)."""
    return [*outputs_root.glob("**/checkpoints/*.ckpt"), *outputs_root.glob("**/hpc_ckpt_*.ckpt")]


def resume_line(checkpoint: str, run_dir: Path) -> str:
    """The one stderr line ``ckpt_path=last`` prints before resuming: which run and file it took
    and, when Hydra made a new folder for this command, where the run writes now and how to
    continue in the original folder instead."""
    if is_remote(checkpoint):
        return f"ckpt_path=last: resuming {checkpoint}; this run writes its logs to {run_dir}"
    source = run_of(Path(checkpoint))
    if source.resolve() == run_dir.resolve():
        return f"ckpt_path=last: resuming {checkpoint} in this run's folder {run_dir}"
    return (
        f"ckpt_path=last: resuming run {source} from {Path(checkpoint).name}; this run writes to {run_dir}; "
        f"to continue in the original folder pass hydra.run.dir={source.resolve()}"
    )
