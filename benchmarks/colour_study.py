"""Mosaic's colour jitter as one RGB matrix against additive HSV shifts: make train's recipe for
five seeds a side, the two alternating seed by seed, scored the same way.

    python benchmarks/colour_study.py --out /tmp/colour_study            # seeds 0-4
    python benchmarks/colour_study.py --out /tmp/colour_study --report   # the table of runs done

Each run is ``python train.py seed=S augment.colour=C <extra> hydra.run.dir=OUT/<C>/seed-S``;
runs whose summary.json exists are kept, so a stopped study resumes. ``--extra`` (e.g. a retuned
``augment.saturation=[0.6,1.4]``) goes to the matrix side only and names its folder. The rule,
stated before any run: matrix may be the default only if its mean mAP (0.5:0.95) is not below
hsv's by more than max(0.01, 2 x the pooled standard deviation).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from partner_pool_study import pooled_std  # noqa: E402
from partner_window_study import train  # noqa: E402


def settings(extra: list[str]) -> dict[str, list[str]]:
    matrix = "matrix" + "".join(f"_{e.split('.')[-1].replace('=', '-')}" for e in extra)
    return {matrix: ["augment.colour=matrix", *extra], "hsv": ["augment.colour=hsv"]}


def report(results: dict[str, list[dict]]) -> str:
    lines = ["| colour | seeds | mAP mean ± std | mAP@0.5 mean ± std | per seed mAP |", "|---|---|---|---|---|"]
    for name, rows in results.items():
        cells = []
        for stat in ("map", "map50"):
            values = [r[stat] for r in rows]
            cells.append(f"{statistics.mean(values):.4f} ± {statistics.stdev(values) if len(values) > 1 else 0:.4f}")
        per_seed = ", ".join(f"{r['map']:.4f}" for r in rows)
        lines.append(f"| {name} | {len(rows)} | {cells[0]} | {cells[1]} | {per_seed} |")
    matrix_name, hsv_name = list(results)
    matrix, hsv = [r["map"] for r in results[matrix_name]], [r["map"] for r in results[hsv_name]]
    if not matrix or not hsv:
        return "\n".join(lines)
    drop = statistics.mean(hsv) - statistics.mean(matrix)
    spread = pooled_std([matrix, hsv]) if min(len(matrix), len(hsv)) > 1 else 0.0
    bar = max(0.01, 2 * spread)
    verdict = "matrix may be the default" if drop <= bar else "hsv stays the default"
    lines += ["", f"mAP drop of matrix: {drop:+.4f}; pooled std {spread:.4f}; bar max(0.01, 2 x {spread:.4f}) "
                  f"= {bar:.4f}; rule: {verdict}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--extra", nargs="*", default=[], help="overrides of the matrix side (a retune)")
    parser.add_argument("--report", action="store_true", help="print the table of the runs already done")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {name: [] for name in settings(args.extra)}
    for seed in args.seeds:
        for name, overrides in settings(args.extra).items():
            if args.report and not (args.out / name / f"seed-{seed}" / "summary.json").exists():
                continue
            summary = train(args.out, name, overrides, seed)
            results[name].append({"map": summary["map"], "map50": summary["map50"], "seed": seed})
    table = report(results)
    (args.out / "study.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
