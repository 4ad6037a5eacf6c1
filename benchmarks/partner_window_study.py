"""Window partners against whole-dataset partners (issue 54's accuracy rule): make train's recipe
for several seeds a side, the two settings alternating seed by seed, scored the same way.

    python benchmarks/partner_window_study.py --out /tmp/window_study            # seeds 0-4, W = 48
    python benchmarks/partner_window_study.py --out /tmp/window_study --report   # the table only

Each run is ``python train.py seed=S <setting's overrides> hydra.run.dir=OUT/<setting>/seed-S``;
runs whose summary.json exists are kept, so a stopped study resumes. The rule (issue 54, stated
before any run): window partners may be the default only if their mean mAP (0.5:0.95) is not
below the whole-dataset mean by more than max(0.01, 2 x the pooled standard deviation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from partner_pool_study import pooled_std  # noqa: E402


def settings(window: int) -> dict[str, list[str]]:
    return {
        f"window-{window}": ["augment.partners=window", f"augment.partner_window={window}"],
        "dataset": ["augment.partners=dataset"],
    }


def train(out: Path, name: str, overrides: list[str], seed: int) -> dict:
    folder = out / name / f"seed-{seed}"
    summary = folder / "summary.json"
    if not summary.exists():
        cmd = [sys.executable, "train.py", f"seed={seed}", *overrides, f"hydra.run.dir={folder}"]
        print("+", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(summary.read_text())


def report(
    results: dict[str, list[dict]],
    column: str = "partners",
    verdicts: tuple[str, str] = ("window partners may be the default", "keep whole-dataset partners"),
) -> str:
    """The table of two settings' runs, and the rule's line: the first setting, the challenger,
    may become the default if its mean mAP is not below the second's by more than
    max(0.01, 2 x the pooled standard deviation); ``verdicts``: (it may, it may not)."""
    lines = [f"| {column} | seeds | mAP mean ± std | mAP@0.5 mean ± std | per seed mAP |", "|---|---|---|---|---|"]
    for name, rows in results.items():
        if not rows:
            lines.append(f"| {name} | 0 | — | — | — |")
            continue
        cells = []
        for stat in ("map", "map50"):
            values = [r[stat] for r in rows]
            cells.append(f"{statistics.mean(values):.4f} ± {statistics.stdev(values) if len(values) > 1 else 0:.4f}")
        per_seed = ", ".join(f"{r['map']:.4f}" for r in rows)
        lines.append(f"| {name} | {len(rows)} | {cells[0]} | {cells[1]} | {per_seed} |")
    challenger_name, default_name = list(results)
    challenger, default = [r["map"] for r in results[challenger_name]], [r["map"] for r in results[default_name]]
    if not challenger or not default:
        return "\n".join(lines)
    drop = statistics.mean(default) - statistics.mean(challenger)
    spread = pooled_std([challenger, default]) if min(len(challenger), len(default)) > 1 else 0.0
    bar = max(0.01, 2 * spread)
    lines += [
        "",
        f"mAP drop of {challenger_name}: {drop:+.4f}; pooled std {spread:.4f}; bar max(0.01, 2 x {spread:.4f}) "
        f"= {bar:.4f}; rule: {verdicts[0] if drop <= bar else verdicts[1]}",
    ]
    return "\n".join(lines)


def study(out: Path, settings: dict[str, list[str]], seeds: list[int], report_only: bool) -> dict[str, list[dict]]:
    """Each setting's runs, the settings alternating seed by seed (with ``report_only``, the runs
    already done)."""
    results: dict[str, list[dict]] = {name: [] for name in settings}
    for seed in seeds:
        for name, overrides in settings.items():
            if report_only and not (out / name / f"seed-{seed}" / "summary.json").exists():
                continue
            summary = train(out, name, overrides, seed)
            results[name].append({"map": summary["map"], "map50": summary["map50"], "seed": seed})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--window", type=int, default=48)
    parser.add_argument("--report", action="store_true", help="print the table of the runs already done")
    args = parser.parse_args()
    table = report(study(args.out, settings(args.window), args.seeds, args.report))
    (args.out / "study.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
