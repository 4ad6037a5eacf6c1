"""dataset.verify=true: scan every image once (threaded) and report problems in one table."""

from __future__ import annotations

import json
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cocodet.datasets.index import CocoIndex
from cocodet.errors import BadSampleError
from cocodet.images.header import DEFAULT_MAX_IMAGE_PIXELS
from cocodet.images.read import load_raw

log = logging.getLogger(__name__)


def scan(index: CocoIndex, threads: int = 8, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> list[dict]:
    """Decode every image of ``index``; return one record per problem (file, image id, reason)."""

    def check(k: int) -> dict | None:
        try:
            load_raw(index, k, max_pixels=max_pixels)  # OpenCV releases the GIL while decoding: threads scale
        except BadSampleError as e:
            return {"index": k, "image_id": e.image_id, "file": e.path, "reason": e.reason}
        return None

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return [r for r in pool.map(check, range(len(index))) if r is not None]


def report_table(split: str, index: CocoIndex, problems: list[dict]) -> str:
    lines = [
        f"{split}: {len(index)} images, {len(problems)} problems; "
        f"annotations dropped while indexing: {dict(index.dropped)}"
    ]
    kinds = Counter(p["reason"].split(":")[0] for p in problems)
    for kind, n in kinds.most_common():
        lines.append(f"  {n:6d}  {kind}")
    for p in problems[:20]:
        lines.append(f"    image_id={p['image_id']} {p['file']}: {p['reason']}")
    if len(problems) > 20:
        lines.append(f"    ... {len(problems) - 20} more in verify.json")
    return "\n".join(lines)


def verify_indexes(train: CocoIndex, val: CocoIndex, run_dir: Path, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> dict:
    """Scan train and val; log the table, write ``verify.json``; return the problems by split."""
    out = {}
    for split, index in (("train", train), ("val", val)):
        problems = scan(index, max_pixels=max_pixels)
        out[split] = problems
        log.info("dataset.verify\n%s", report_table(split, index, problems))
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / "verify.json").write_text(json.dumps(out, indent=1))
    return out
