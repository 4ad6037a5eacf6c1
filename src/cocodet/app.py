"""run(cfg): read the run specification, probe the host, plan the loader, then the mode's own function.

Wiring only. The config tree is read once, here, into a ``RunSpec`` (``cocodet/run_spec``); modes
dispatch through ``cocodet.modes.MODE_TABLE`` (one function per mode, in the module of its
concern), imported when the mode runs, and take the spec.
"""

from __future__ import annotations

import importlib
import sys

from omegaconf import DictConfig

from cocodet.datasets.bad_samples import JSONL_NAME as BAD_SAMPLES_FILE
from cocodet.errors import RunStopped
from cocodet.loader.plan.resources import raise_nofile_limit
from cocodet.models import checkpoint_store
from cocodet.models.checkpoint_store import CheckpointFolder
from cocodet.modes import MODE_TABLE
from cocodet.modes.wiring import build_plan
from cocodet.run_spec.read import read_spec
from cocodet.storage.session import configure as configure_store
from cocodet.summary_file import write_summary
from cocodet.tracking.unsent import UNSENT_NAME, unsent_line

# The run's records copied beside checkpoints kept elsewhere (the attempts ledger copies itself: elastic/attempts.py)
RECORDS = ("summary.json", UNSENT_NAME, BAD_SAMPLES_FILE)


def run(cfg: DictConfig) -> dict:
    spec = read_spec(cfg)
    # How a URL dataset root (and predict.source) is opened, for every mode (storage/session.py)
    configure_store(spec.storage.options, rank=spec.ranks.global_rank, **spec.storage.remote)
    # Where checkpoints are written and found, and its store's options (models/checkpoint_store.py)
    checkpoint_store.configure(CheckpointFolder(spec.checkpoint.dir, spec.checkpoint.options))
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    raise_nofile_limit()
    plan, resources = build_plan(spec)
    module, function = MODE_TABLE[spec.mode].split(":")  # the mode's module, imported only now
    try:
        summary = getattr(importlib.import_module(module), function)(spec, plan, resources)
    except RunStopped as e:  # a full disk, a diverged run: the summary as far as it got, then one error line (cli)
        if e.summary is not None and spec.ranks.global_rank == 0:
            _end_lines(spec, e.summary)
        raise
    if spec.ranks.global_rank == 0:  # one summary per run, written by rank 0 (DDP: after the others ended)
        _end_lines(spec, summary)
    return summary


def copy_records(spec) -> None:
    """A training run's records beside its checkpoints, where those are kept elsewhere."""
    for name in RECORDS:
        checkpoint_store.copy_record(spec.run_dir / name, spec.checkpoint.dir)


def _end_lines(spec, summary: dict) -> None:
    """The summary (summary.json, a training run's records copied beside its checkpoints, and
    stdout's last line), then, when MLflow calls were left unsent, the stderr line that says so
    and how to send them (the last, but for cli's error line)."""
    write_summary(spec.run_dir, summary, then=(lambda _: copy_records(spec)) if spec.mode == "train" else None)
    line = unsent_line(summary.get("mlflow"))
    if line:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
