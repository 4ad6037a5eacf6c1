"""A resumed run's CSV and TensorBoard records continue its own: the newest ``version_N`` folder
of this run's folder, not a new one per attempt, without the rows of the steps the resumed
attempt trains again.

Lightning starts ``version_{N+1}`` for every process that logs, so a run that torchrun restarted
(or a user resumed) was split over several folders, with the steps redone in two of them. Here
the resumed attempt takes the newest folder; its ``metrics.csv`` keeps the rows logged before the
resumed step (a row's ``step`` is the optimizer step it follows: ``global_step - 1``, so rows at
``step >= resumed_step`` are the ones trained again) and the new rows follow them;
TensorBoard's writer is given ``purge_step``, which hides the events of those steps. An MLflow
run cannot drop points: a resumed one (the checkpoint's run id) shows the redone steps twice.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import warnings
from pathlib import Path

log = logging.getLogger(__name__)


def continue_logs(loggers, resumed_step: int) -> None:
    """Point Lightning's CSV and TensorBoard loggers (not yet writing) at their newest version
    folder, dropping what followed ``resumed_step`` there. Call on rank 0 before ``fit``."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    for logger in loggers:
        if not isinstance(logger, (CSVLogger, TensorBoardLogger)) or logger._version is not None:
            continue  # another logger, or a version the config chose
        newest = _newest_version(Path(logger.root_dir))
        if newest is None:
            continue
        logger._version = newest
        if isinstance(logger, TensorBoardLogger):
            logger._kwargs["purge_step"] = resumed_step
        else:
            _keep_rows_before(logger, resumed_step)
        log.info("%s continues %s from step %d", type(logger).__name__, logger.log_dir, resumed_step)


def _newest_version(root: Path) -> int | None:
    found = [
        int(m.group(1))
        for p in (root.iterdir() if root.is_dir() else [])
        if (m := re.fullmatch(r"version_(\d+)", p.name)) and p.is_dir()
    ]
    return max(found) if found else None


def _keep_rows_before(logger, step: int) -> None:
    """metrics.csv with its rows before ``step`` only, read back in after Lightning's writer,
    which deletes the file it finds, has started."""
    path = Path(logger.log_dir) / "metrics.csv"
    text = path.read_text() if path.is_file() else ""
    rows = list(csv.DictReader(io.StringIO(text)))
    header = next(csv.reader(io.StringIO(text)), [])
    kept = [r for r in rows if not str(r.get("step", "")).isdigit() or int(r["step"]) < step]
    with warnings.catch_warnings():  # "... will be deleted": not so, the rows are written back below
        warnings.filterwarnings("ignore", message="Experiment logs directory")
        writer = logger.experiment  # deletes metrics.csv
    if not header:
        return
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=header)
        out.writeheader()
        out.writerows(kept)
    writer.metrics_keys = sorted(header)
    if header != writer.metrics_keys:  # Lightning writes its keys sorted: rewrite once so appends line up
        writer._rewrite_with_new_header(writer.metrics_keys)
