"""``ckpt_path``: which checkpoint a run resumes (or a mode loads), and why (README "Resuming").

- a file, or an object (``s3://...``): that one; a bucket's checkpoint whose bytes differ from
  the digest its upload recorded is refused;
- none: a fresh start, except under torchrun, where it means ``last_if_any``: an attempt that
  torchrun restarts (``--max-restarts``), or a node's agent started again in place of a lost
  one, runs the command it was launched with and must resume the run, not start it again;
- ``last_if_any``: the newest checkpoint in ``checkpoint.dir`` (by default the run folder's
  ``checkpoints/``) if there is one, else none (start fresh): what a rescheduled pod running its
  first command needs, and never another run's;
- ``last``: ``checkpoint.dir`` first (a requeued job's); with ``hydra.run.dir`` on the command
  line or a ``checkpoint.dir`` of its own, that folder only; else the newest run under
  ``outputs/`` whose dataset and model are this run's, as its saved ``.hydra/config.yaml`` says;
  runs of another dataset or model are passed over, and the line printed says which run was
  taken and how many were passed over, and why.

Both keywords take the newest checkpoint that reads whole, passing over (with a warning) one
whose bytes differ from its recorded digest.

Whatever is taken must still fit the model this run builds: the modes load it through
``inference/checkpoint.py:load_weights``, which refuses another shape in one line.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import yaml

from cocodet.datasets.layouts import layout_keys
from cocodet.errors import UserError
from cocodet.models import checkpoint_store
from cocodet.models.checkpoint_file import load_checkpoint
from cocodet.models.checkpoint_store import CheckpointDigestError
from cocodet.models.preemption import checkpoints_in_run, checkpoints_under, resume_line, run_of
from cocodet.run_spec.records import RunSpec

log = logging.getLogger(__name__)

OUTPUTS = Path("outputs")
# The dataset keys that say which images and labels a run learned (not how they were loaded):
# the layout, its root and every layout's own keys.
DATASET_IDENTITY = ("layout", "root", *layout_keys())
# What a run's config means without the key (saved before dataset.layout existed: a COCO layout)
IDENTITY_DEFAULTS = {"layout": "coco"}
# model.detector keys that only say where the first weights came from: a resumed run has its own.
INITIAL_WEIGHTS = {"pretrained", "pretrained_backbone", "weights_path", "weights_backbone_path"}


def resume_checkpoint(spec: RunSpec) -> tuple[str | None, dict]:
    """(the checkpoint ``spec.ckpt_path`` names, as the module docstring says, and what it holds,
    read once), or (None, {}) for a fresh start. ``last`` and ``last_if_any`` take the newest
    checkpoint that reads whole: one whose bytes differ from its recorded digest is passed over
    with a warning; a named one is refused (``models/checkpoint_store.py``)."""
    ckpt, run_dir = spec.ckpt_path, spec.run_dir
    if ckpt is None and spec.ranks.launcher == "torchelastic":  # a restarted attempt resumes as launched
        log.info(
            "under torchrun, no ckpt_path means last_if_any: %s is where a restarted attempt finds its checkpoints",
            spec.checkpoint.dir,
        )
        ckpt = "last_if_any"
    if ckpt not in ("last", "last_if_any"):
        return (ckpt, load_checkpoint(ckpt, spec.weights_only)) if ckpt else (None, {})
    found, why = checkpoints_here(spec), ""
    if ckpt == "last_if_any":
        path, checkpoint = newest_whole(found, spec.weights_only)
        log.info(
            "ckpt_path=last_if_any: %s",
            f"resuming {path}" if path else f"no checkpoint in {spec.checkpoint.dir}, starting fresh",
        )
        return path, checkpoint
    if not found and (spec.run_dir_given or not spec.checkpoint.in_run_dir):
        raise UserError(
            f"ckpt_path=last: no checkpoint in {spec.checkpoint.dir} (checkpoint.dir) nor a hpc_ckpt_*.ckpt in "
            f"{run_dir}; pass the folder of the run to resume (hydra.run.dir, or checkpoint.dir), ckpt_path=<file>, "
            "or ckpt_path=last_if_any to start fresh there"
        )
    if not found:
        newest, why = newest_fitting(spec, OUTPUTS)
        found = [str(p) for p in sorted(checkpoints_in_run(run_of(newest)), key=_mtime, reverse=True)]
    path, checkpoint = newest_whole(found, spec.weights_only)
    if path is None:
        raise UserError(f"ckpt_path=last: none of the {len(found)} checkpoints found reads whole (warnings above)")
    if spec.ranks.global_rank == 0:  # one line per run, not per rank
        print(resume_line(path, run_dir) + why, file=sys.stderr, flush=True)
    return path, checkpoint


def checkpoints_here(spec: RunSpec) -> list[str]:
    """This run's checkpoints, newest first: ``checkpoint.dir``'s and the run folder's SLURM
    ``hpc_ckpt_*.ckpt``."""
    found = checkpoint_store.checkpoints_in(spec.checkpoint.dir)
    found += [(str(p), _mtime(p)) for p in spec.run_dir.glob("hpc_ckpt_*.ckpt")]
    return [p for p, _ in sorted(found, key=lambda item: item[1], reverse=True)]


def newest_whole(found: list[str], weights_only: bool) -> tuple[str | None, dict]:
    """(the first of ``found`` whose bytes are the ones written, read), or (None, {})."""
    for path in found:
        try:
            return path, load_checkpoint(path, weights_only)
        except CheckpointDigestError as e:
            log.warning("passed over: %s", e)
    return None, {}


def _mtime(path) -> float:
    return Path(path).stat().st_mtime


def newest_fitting(spec: RunSpec, outputs: Path) -> tuple[Path, str]:
    """(the newest checkpoint under ``outputs`` of a run with this dataset and model, what was
    passed over): by mtime, any kind (a run preempted before its first epoch end holds only
    ``resume.ckpt``)."""
    found = sorted(checkpoints_under(outputs), key=lambda p: p.stat().st_mtime, reverse=True)
    if not found:
        raise UserError(
            f"ckpt_path=last found no checkpoint in {spec.run_dir} nor in any run under {outputs}; "
            "pass hydra.run.dir=<the interrupted run's folder> or ckpt_path=<file>"
        )
    passed: dict[Path, str] = {}
    for checkpoint in found:
        run = run_of(checkpoint)
        if run not in passed:
            passed[run] = differs(spec, run)
        if not passed[run]:
            others = {r: why for r, why in passed.items() if why}
            return checkpoint, (
                f" (the newest of the runs under {outputs} with this dataset and model; passed over "
                f"{len(others)} newer: {_listed(others)})"
                if others
                else ""
            )
    raise UserError(
        f"ckpt_path=last: none of the {len(passed)} runs under {outputs} with a checkpoint was trained on "
        f"this dataset and model ({_listed(passed)}); pass hydra.run.dir=<the run's folder> or "
        "ckpt_path=<file>"
    )


def differs(spec: RunSpec, run: Path) -> str:
    """Why ``run`` is not this run's (its saved config's dataset or model differs), or "" when it is."""
    saved_file = run / ".hydra" / "config.yaml"
    try:
        saved = yaml.safe_load(saved_file.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return f"no readable {saved_file}"
    data = saved.get("dataset") or {}
    for key in DATASET_IDENTITY:
        ours, theirs = spec.dataset.get(key, IDENTITY_DEFAULTS.get(key)), data.get(key, IDENTITY_DEFAULTS.get(key))
        if key == "root" and ours is not None and theirs is not None:
            ours, theirs = _where(str(ours)), _where(str(theirs))
        if ours != theirs:
            return f"dataset.{key} {theirs!r}"
    detector = (saved.get("model") or {}).get("detector") or {}
    ours = (spec.model.config.get("detector") or {}) if spec.model is not None else {}
    for key in sorted((set(detector) & set(ours)) - INITIAL_WEIGHTS):  # keys both know (a release may add some)
        if detector.get(key) != ours.get(key):
            return f"model.detector.{key} {detector.get(key)!r}"
    return ""


def _where(root: str) -> str:
    return root if "://" in root else os.path.abspath(os.path.expanduser(root))


def _listed(why: dict[Path, str]) -> str:
    shown = [f"{run} ({reason})" for run, reason in list(why.items())[:3]]
    return "; ".join(shown) + (f"; and {len(why) - 3} more" if len(why) > 3 else "")
