"""A study's end: ``best.yaml``, the one command that reuses it, every trial's row, the plots.

``best.yaml``: the best trial's number, figure and overrides (the sweep's fixed ones, then the
trial's own). ``trials.md``: one row per trial of the study (every launch and launcher): its
number, state, figure, parameters and, for a failed one, why. ``history.png`` and
``importance.png``: the study's optimisation history and its parameters' importances.
"""

from __future__ import annotations

import logging
import shlex
import warnings
from pathlib import Path

import yaml

from cocodet.search import space, trials

log = logging.getLogger(__name__)

BEST_FILE, TRIALS_FILE = "best.yaml", "trials.md"


def conclude(study, sweep_dir: Path, fixed: list[str], metric: str, direction: str, lists: dict) -> dict | None:
    rows = trial_rows(study)
    (sweep_dir / TRIALS_FILE).write_text(table(rows, metric) + "\n")
    plots(study, sweep_dir)
    complete = [t for t in study.get_trials(deepcopy=False) if t.value is not None]
    if not complete:
        log.warning(
            "study %s: no trial completed; see %s for each one's failure", study.study_name, sweep_dir / TRIALS_FILE
        )
        return None
    best = study.best_trial
    overrides = [*fixed, *space.overrides(best.params, lists)]
    record = {
        "trial": best.number,
        metric: best.value,
        "metric": metric,
        "direction": direction,
        "study": study.study_name,
        "overrides": overrides,
    }
    (sweep_dir / BEST_FILE).write_text(yaml.safe_dump(record, sort_keys=False))
    command = "python train.py " + " ".join(shlex.quote(o) for o in overrides)
    print(
        f"best: trial {best.number}, {metric} = {best.value:g} ({sweep_dir / BEST_FILE}); reuse it: {command}",
        flush=True,
    )
    return record


def load_study(sweep_dir: Path, storage: str | None = None):
    """The study a searching sweep recorded in ``study.json`` (None: not one). ``storage``: the
    URL with its credentials, where the record holds it redacted."""
    import json

    import optuna

    from cocodet.search.storage import open_storage

    record = Path(sweep_dir) / "study.json"
    if not record.is_file():
        return None
    written = json.loads(record.read_text())
    where = open_storage(storage or written["storage"], Path(sweep_dir))
    return optuna.load_study(study_name=written["study_name"], storage=where), written


def trial_rows(study) -> list[dict]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name.lower(),
                "value": t.value,
                **t.params,
                "failure": t.user_attrs.get(trials.FAILURE),
            }
        )
    return rows


def table(rows: list[dict], metric: str) -> str:
    params = sorted({k for r in rows for k in r} - {"trial", "state", "value", "failure"})
    cols = ["trial", "state", metric, *params, "failure"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r["trial"], r["state"], r["value"], *(r.get(p) for p in params), r.get("failure")]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def plots(study, sweep_dir: Path) -> list[Path]:
    """The optimisation history and (two completed trials or more) the parameters' importances."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.exceptions import ExperimentalWarning
    from optuna.visualization import matplotlib as optuna_plots

    warnings.filterwarnings("ignore", category=ExperimentalWarning)  # the plots' interface, not their figures
    written = []
    for name, draw in (
        ("history.png", optuna_plots.plot_optimization_history),
        ("importance.png", optuna_plots.plot_param_importances),
    ):
        try:
            axes = draw(study)
        except (ValueError, RuntimeError, ZeroDivisionError) as e:  # too few completed trials to rank
            log.info("study plot %s not drawn: %s", name, " ".join(str(e).split())[:200])
            continue
        axes.figure.set_size_inches(8, 4.5)
        axes.figure.tight_layout()
        axes.figure.savefig(sweep_dir / name, dpi=110)
        plt.close(axes.figure)
        written.append(sweep_dir / name)
    return written


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "/")
