"""The run's summary, where users and scripts read it: ``summary.json`` in the run dir, and the same
object as the last line on stdout (design §2). A full or read-only disk still leaves stdout's copy."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


def write_summary(run_dir: Path, summary: dict, then=None) -> None:
    """summary.json in the run dir, and the same object as the last line on stdout (design §2);
    ``then(run_dir)`` runs between the two (what it logs stays above the summary's line)."""
    text = json.dumps(summary, default=str)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text(text + "\n")
    except OSError as e:  # a full or read-only disk: stdout still gets it
        logging.getLogger(__name__).warning(
            "summary.json not written in %s (%s); it follows on stdout", run_dir, e.strerror or e
        )
    if then is not None:
        then(run_dir)
    sys.stdout.flush()
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
