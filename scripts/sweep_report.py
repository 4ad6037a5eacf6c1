"""Report a mode=bench multirun: markdown table on stdout, PNG plot beside the sweep.

    python train.py -m mode=bench loader.num_workers=0,1,2,4 loader.prefetch_factor=1,2
    python scripts/sweep_report.py multirun/<date>/<time> [--png out.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cocodet.bench.report import load_sweep, markdown_table, plot


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_dir", type=Path)
    p.add_argument("--png", type=Path, default=None, help="default: <sweep_dir>/sweep.png")
    args = p.parse_args()
    rows = load_sweep(args.sweep_dir)
    table = markdown_table(rows)
    (args.sweep_dir / "sweep.md").write_text(table + "\n")
    png = plot(rows, args.png or args.sweep_dir / "sweep.png")
    print(table)
    print(f"\nplot: {png}")


if __name__ == "__main__":
    main()
