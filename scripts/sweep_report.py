"""Report a mode=bench multirun: markdown table on stdout, PNG plot beside the sweep.

    python train.py -m mode=bench loader.num_workers=0,1,2,4 loader.prefetch_factor=1,2
    python scripts/sweep_report.py multirun/<date>/<time> [--png out.png]

A searching sweep (``-m hparams_search=...``): every trial of its study, with its state, figure,
parameters and failure, into ``trials.md``, and the study's plots (``--storage``: the study's
URL with its credentials, where study.json holds it redacted).

With ``logger=mlflow`` the sweep is also one MLflow parent run; ``--mlflow`` reads its child runs
back from the tracking store instead of the job folders (``--tracking-uri``: default
MLFLOW_TRACKING_URI, else the URI the sweep wrote in mlflow_parent.json).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cocodet.bench.report import load_sweep, markdown_table, plot


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_dir", type=Path)
    p.add_argument("--png", type=Path, default=None, help="default: <sweep_dir>/sweep.png")
    p.add_argument("--mlflow", action="store_true", help="read the sweep's runs from MLflow, not its folders")
    p.add_argument("--tracking-uri", default=None, help="with --mlflow (credentials: MLFLOW_TRACKING_* variables)")
    p.add_argument("--storage", default=None, help="a searching sweep's storage URL, credentials included")
    args = p.parse_args()
    if (args.sweep_dir / "study.json").is_file() and not args.mlflow:
        return study_report(args.sweep_dir, args.storage)
    rows = load_sweep(args.sweep_dir) if not args.mlflow else mlflow_rows(args.sweep_dir, args.tracking_uri)
    table = markdown_table(rows)
    (args.sweep_dir / "sweep.md").write_text(table + "\n")
    png = plot(rows, args.png or args.sweep_dir / "sweep.png")
    print(table)
    print(f"\nplot: {png}")


def study_report(sweep_dir: Path, storage: str | None) -> None:
    from cocodet.search.winner import TRIALS_FILE, load_study, plots, table, trial_rows

    study, record = load_study(sweep_dir, storage)
    text = table(trial_rows(study), record["metric"])
    (sweep_dir / TRIALS_FILE).write_text(text + "\n")
    print(text)
    print("\nplots: " + ", ".join(str(p) for p in plots(study, sweep_dir)))


def mlflow_rows(sweep_dir: Path, tracking_uri: str | None) -> list[dict]:
    import json
    import os

    from cocodet.tracking.readback import load_sweep_runs, parent_of
    from cocodet.tracking.sweep import PARENT_FILE

    written = json.loads((sweep_dir / PARENT_FILE).read_text()) if (sweep_dir / PARENT_FILE).is_file() else {}
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or written.get("tracking_uri")
    return load_sweep_runs(parent_of(sweep_dir), uri)


if __name__ == "__main__":
    main()
