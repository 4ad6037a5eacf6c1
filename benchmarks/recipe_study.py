"""Issue 45's study: the FCOS regression prior, EMA weights and partner pools, five seeds each.

    python benchmarks/recipe_study.py --out /tmp/recipe_study                # seeds 0-4, every arm
    python benchmarks/recipe_study.py --out /tmp/recipe_study --report       # the tables only

Each run is ``python train.py seed=S hydra.run.dir=OUT/ARM/seed-S`` plus the arm's overrides
(``make train``'s settings otherwise); runs whose summary.json exists are kept, so a stopped study
resumes. The arms:

- ``before``: the recipe before the fix (torchvision's regression bias 0), pools of 8;
- ``default``: the fixed recipe (bias 1) with pools of 8 (the default partners until this
  study) and ``model.ema.decay`` on. EMA never feeds
  back into training (Lightning's WeightAveraging trains the raw weights and keeps the average
  beside them), so the run's own validation scores the average, and its ``last.ckpt`` also
  carries the raw weights (``current_model_state``), which ``mode=eval`` scores. One run per
  seed gives both sides of the EMA question, paired on the same trajectory;
- ``whole``: bias 1, partners from the whole dataset (``augment.partners=dataset``).

The rule (issue 45, stated before any run): a change becomes the default only if its mean gain
exceeds max(0.01, 2 x the pooled standard deviation of the two sides), on mAP (0.5:0.95) for
EMA and pools; the fix must keep the mean mAP@0.5 within 0.01 of the recipe before it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from partner_pool_study import pooled_std  # noqa: E402

EMA_DECAY = "0.9998"  # README's suggestion; over 360 steps the warm-up ramp (1+n)/(10+n) sets the decay
ARMS = {
    "default": ["augment.partner_pool=8", f"model.ema.decay={EMA_DECAY}"],
    "whole": ["augment.partners=dataset"],
    "before": ["augment.partner_pool=8", "model.detector.regression_bias=0.0"],
}
STATS = ("map", "map75", "map50")


def train(folder: Path, seed: int, overrides: list[str]) -> dict:
    summary = folder / "summary.json"
    if not summary.exists():
        cmd = [sys.executable, "train.py", f"seed={seed}", f"hydra.run.dir={folder}", *overrides]
        print("+", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return json.loads(summary.read_text())


def raw_weights(folder: Path, seed: int, overrides: list[str]) -> dict:
    """The EMA run's raw weights scored by mode=eval: last.ckpt with ``state_dict`` swapped for
    ``current_model_state`` (the averaging keys dropped, so nothing swaps them back)."""
    summary = folder / "raw-eval" / "summary.json"
    if not summary.exists():
        ckpt = torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        ckpt["state_dict"] = ckpt.pop("current_model_state")
        ckpt.pop("averaging_state", None)
        raw = folder / "checkpoints" / "raw.ckpt"
        torch.save(ckpt, raw)
        cmd = [
            sys.executable,
            "train.py",
            "mode=eval",
            f"ckpt_path={raw}",
            f"seed={seed}",
            f"hydra.run.dir={folder / 'raw-eval'}",
            *[o for o in overrides if not o.startswith("model.ema")],
        ]
        print("+", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return json.loads(summary.read_text())


def healthy(s: dict) -> bool:
    return s.get("status") == "completed" and not (s.get("health") or {}).get("warnings")


def side(name: str, rows: list[dict]) -> str:
    cells = []
    for stat in STATS:
        values = [r[stat] for r in rows]
        cells.append(f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}")
    per_seed = " / ".join(f"{r['map']:.3f}" for r in rows)
    per_seed50 = " / ".join(f"{r['map50']:.3f}" for r in rows)
    ok = sum(healthy(r) for r in rows) if "status" in rows[0] else "-"
    return f"| {name} | {len(rows)} | {ok} | {' | '.join(cells)} | {per_seed} | {per_seed50} |"


def rule(stat: str, base: list[dict], other: list[dict], what: str) -> str:
    a, b = [r[stat] for r in base], [r[stat] for r in other]
    gain = statistics.mean(b) - statistics.mean(a)
    spread = pooled_std([a, b])
    bar = max(0.01, 2 * spread)
    verdict = f"make {what} the default" if gain > bar else f"keep the default ({what} stays off)"
    return (
        f"{stat} gain of {what}: {statistics.mean(b):.4f} - {statistics.mean(a):.4f} = {gain:+.4f}; pooled std "
        f"{spread:.4f}; bar max(0.01, 2 x {spread:.4f}) = {bar:.4f}; rule: {verdict}"
    )


def report(results: dict[str, list[dict]]) -> str:
    head = [
        "| arm | seeds | healthy | mAP mean ± std | mAP@0.75 mean ± std | mAP@0.5 mean ± std "
        "| mAP per seed | mAP@0.5 per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    names = {
        "before": "bias 0 (before), pools of 8",
        "default": "bias 1, pools of 8, raw weights",
        "default-ema": "bias 1, pools of 8, EMA weights (same runs)",
        "whole": "bias 1, whole-dataset partners",
    }
    lines = head + [side(names[arm], rows) for arm, rows in results.items() if rows]
    lines.append("")
    if results.get("before") and results.get("default"):
        before = statistics.mean(r["map50"] for r in results["before"])
        after = statistics.mean(r["map50"] for r in results["default"])
        lines.append(
            f"fix: mAP@0.5 {after:.4f} against {before:.4f} before; floor {before - 0.01:.4f}: "
            f"{'kept' if after >= before - 0.01 else 'LOST'}"
        )
    if results.get("default") and results.get("default-ema"):
        lines.append(rule("map", results["default"], results["default-ema"], "EMA"))
    if results.get("default") and results.get("whole"):
        lines.append(rule("map", results["default"], results["whole"], "whole-dataset partners"))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--report", action="store_true", help="print the tables from the runs already there")
    args = ap.parse_args()
    results: dict[str, list[dict]] = {"before": [], "default": [], "default-ema": [], "whole": []}
    runs = [(seed, arm, args.out / arm / f"seed-{seed}") for seed in args.seeds for arm in args.arms]
    # Seed by seed, so that a study stopped early has every arm at equal seeds; the raw weights'
    # evaluations after every training run.
    runs = [r for r in runs if not args.report or (r[2] / "summary.json").exists()]
    trained = {(seed, arm): train(folder, seed, ARMS[arm]) for seed, arm, folder in runs}
    for seed, arm, folder in runs:
        s = trained[(seed, arm)]
        if arm == "default":
            if args.report and not (folder / "raw-eval" / "summary.json").exists():
                continue
            results["default-ema"].append(s)
            results["default"].append(
                raw_weights(folder, seed, ARMS[arm]) | {"status": s["status"], "health": s.get("health")}
            )
        else:
            results[arm].append(s)
    print(report(results))


if __name__ == "__main__":
    main()
