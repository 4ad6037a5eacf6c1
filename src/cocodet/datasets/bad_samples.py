"""Bad-sample accounting (design §6): the record of a skipped image, the per-epoch counts, and
the one ``bad_samples.jsonl`` writer that training, ``mode=bench`` and ``mode=predict`` share."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from cocodet.errors import BadSampleError

JSONL_NAME = "bad_samples.jsonl"


def skip_record(error: BadSampleError, epoch: int, index: int, role: str) -> dict:
    """The plain record of one replaced image (``role``: sample, replacement (a bad
    image drawn in place of a bad sample) or mosaic_partner)."""
    return {
        "epoch": epoch,
        "index": index,
        "image_id": error.image_id,
        "file": error.path,
        "reason": error.reason,
        "role": role,
    }


def append_records(run_dir: Path | None, stage: str, records) -> None:
    """Append ``records`` to ``<run_dir>/bad_samples.jsonl``, each tagged with ``stage``."""
    if not records or run_dir is None:
        return
    with open(Path(run_dir) / JSONL_NAME, "a") as f:
        for record in records:
            f.write(json.dumps({"stage": stage, **record}) + "\n")


class BadSampleLedger:
    """Seen and replaced samples per (stage, epoch), and the images ``dataset.verify`` kept out,
    so that seen + excluded + skipped equals the split's size for every whole epoch; the
    records go to ``bad_samples.jsonl`` as batches arrive."""

    def __init__(self, run_dir: Path | None):
        self.run_dir = run_dir
        self.split_sizes: dict[str, int] = {}  # stage -> images in the annotation file (before verify)
        self.skipped: Counter = Counter()  # (stage, epoch) -> replaced primary samples
        self.seen: Counter = Counter()
        self.excluded: Counter = Counter()  # stage -> images dataset.verify kept out of sampling

    def exclude(self, stage: str, records: list[dict]) -> None:
        """Images found bad before the run (``dataset.verify``): never sampled, and counted apart
        from the samples skipped while reading."""
        self.excluded[stage] += len(records)
        append_records(self.run_dir, stage, [{**r, "role": "excluded_by_verify"} for r in records])

    def record(self, records: tuple, images: int, stage: str, epoch: int) -> int:
        """Count one batch of ``images`` whose replaced images are ``records``; return the
        primary samples replaced (partners replaced do not change what was seen)."""
        replaced = sum(1 for r in records if r["role"] == "sample")
        self.skipped[(stage, epoch)] += replaced
        self.seen[(stage, epoch)] += images - replaced
        append_records(self.run_dir, stage, records)
        return replaced

    def summary(self) -> dict:
        """Per stage, of the last epoch: ``seen``, ``skipped`` while reading and
        ``excluded_by_verify`` (a whole epoch: they add up to ``images``, the split's size),
        and the reading skips of all epochs."""
        out = {}
        for stage in ("train", "val"):
            epochs = sorted(e for s, e in self.seen if s == stage)
            if epochs:
                last = epochs[-1]
                out[stage] = {
                    "epoch": last,
                    "images": self.split_sizes.get(stage),
                    "seen": self.seen[(stage, last)],
                    "skipped": self.skipped[(stage, last)],
                    "excluded_by_verify": self.excluded[stage],
                    "skipped_all_epochs": sum(n for (s, _), n in self.skipped.items() if s == stage),
                }
        return out
