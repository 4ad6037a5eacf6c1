"""mode=verify: the dataset checked without training. Both splits are indexed as training
indexes them, every image is read and decoded once (``images/verify.py``), the table is logged
and ``verify.json`` written; exit 0 when every image can be used, else one line naming the
first bad files (exit 2), after the summary. No torch, no Lightning."""

from __future__ import annotations

from cocodet.errors import RunStopped
from cocodet.loader.plan.records import LoaderPlan
from cocodet.modes.plan import dataset_indexes
from cocodet.run_spec.records import RunSpec

SHOWN = 3  # bad files the error line names (verify.json lists them all)


class DatasetNotUsable(RunStopped):
    """mode=verify found images that cannot be used."""


def verify(spec: RunSpec, plan: LoaderPlan, resources) -> dict:
    from cocodet.images.verify import verify_indexes

    train, val = dataset_indexes(spec)
    problems = verify_indexes(train, val, spec.run_dir, int(spec.dataset.get("max_image_pixels")))
    report = spec.run_dir / "verify.json"
    summary = {
        "mode": "verify",
        "train_images": len(train),
        "val_images": len(val),
        "problems": {split: len(found) for split, found in problems.items()},
        "dropped_annotations": {"train": dict(train.dropped), "val": dict(val.dropped)},
        "report": str(report),
    }
    bad = [p for split in ("train", "val") for p in problems[split]]
    if bad:
        named = "; ".join(f"{p['file']} (image_id={p['image_id']}): {p['reason']}" for p in bad[:SHOWN])
        more = f", and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        raise DatasetNotUsable(
            f"{len(bad)} image(s) of {len(train) + len(val)} cannot be used: {named}{more}; every "
            f"one is in {report}. Fix or remove them, or train with dataset.on_bad_sample=skip "
            "(they are skipped and counted)",
            summary,
        )
    return summary
