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
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from partner_window_study import report, study  # noqa: E402


def settings(extra: list[str]) -> dict[str, list[str]]:
    matrix = "matrix" + "".join(f"_{e.split('.')[-1].replace('=', '-')}" for e in extra)
    return {matrix: ["augment.colour=matrix", *extra], "hsv": ["augment.colour=hsv"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--extra", nargs="*", default=[], help="overrides of the matrix side (a retune)")
    parser.add_argument("--report", action="store_true", help="print the table of the runs already done")
    args = parser.parse_args()
    results = study(args.out, settings(args.extra), args.seeds, args.report)
    table = report(results, "colour", ("matrix may be the default", "hsv stays the default"))
    (args.out / "study.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
