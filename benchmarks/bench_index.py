"""Start-up at scale: pycocotools' COCO() against cocodet's direct parse into flat arrays, and
the cached (memory-mapped) index, each in a fresh process with its wall time and peak RSS.

    python benchmarks/make_scale_coco.py --src ../shared/data/coco_tiny --out /tmp/coco_scale
    python benchmarks/bench_index.py /tmp/coco_scale/annotations/instances_train2017.json /tmp/coco_scale/train2017
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

WAYS = {
    "pycocotools COCO()": "from pycocotools.coco import COCO; COCO(ANN)",
    "cocodet build_index (direct parse)": "from cocodet.datasets.index import build_index; build_index(ROOT, ANN)",
    "cocodet cached index (2nd start)": (
        "from cocodet.datasets.index_cache import cached_index; cached_index(ROOT, ANN, True, CACHE)"
    ),
}


def measure(code: str) -> dict:
    t0 = time.perf_counter()
    exec(code, {"ANN": ARGS.ann, "ROOT": ARGS.root, "CACHE": ARGS.cache})
    return {
        "seconds": round(time.perf_counter() - t0, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main() -> None:
    rows = {}
    with tempfile.TemporaryDirectory() as cache:
        subprocess.run(
            [
                sys.executable,
                __file__,
                ARGS.ann,
                ARGS.root,
                "--cache",
                cache,
                "--one",
                WAYS["cocodet cached index (2nd start)"],
            ],
            check=True,
            capture_output=True,
        )  # the 1st start
        for name, code in WAYS.items():
            out = subprocess.run(
                [sys.executable, __file__, ARGS.ann, ARGS.root, "--cache", cache, "--one", code],
                check=True,
                capture_output=True,
                text=True,
            )
            rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{ARGS.ann}: wall time and peak RSS of building the index, each in a fresh process")
    print("| way | seconds | peak RSS MiB |\n|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['seconds']} | {r['peak_rss_mb']} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ann")
    parser.add_argument("root")
    parser.add_argument("--cache", default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ARGS = parser.parse_args()
    if ARGS.one:
        print(json.dumps(measure(ARGS.one)))
    else:
        main()
