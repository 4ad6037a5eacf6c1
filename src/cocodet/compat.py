"""Old ``_target_`` paths, mapped to where their classes live now: one table instead of
re-export modules (design §1).

A user's config copied from an older release may name a class by a path that moved. Before
the config's groups are read (``run_spec/read.py``), every ``_target_`` in the plain tree that
this table knows is rewritten to the current path, and the first use of each old path in a
process logs one warning naming the new one. Shipped configs name current paths (tests/test_layout.py).
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

# old path -> current path. The first group moved in the data/transforms re-layout (their
# re-export modules were removed when this table replaced them).
MOVED_TARGETS = {
    "cocodet.data.augment.Basic": "cocodet.transforms.augment.Basic",
    "cocodet.data.augment.Letterbox": "cocodet.transforms.augment.Letterbox",
    "cocodet.data.augment.Mosaic": "cocodet.transforms.augment.Mosaic",
    "cocodet.data.datamodule.CocoDataModule": "cocodet.datamodule.CocoDataModule",
    "cocodet.data.reference_presets.HFlip": "cocodet.transforms.reference_presets.HFlip",
    "cocodet.data.reference_presets.MultiScale": "cocodet.transforms.reference_presets.MultiScale",
    "cocodet.data.reference_presets.LargeScaleJitter": "cocodet.transforms.reference_presets.LargeScaleJitter",
    "cocodet.data.reference_presets.ModelResize": "cocodet.transforms.reference_presets.ModelResize",
    "cocodet.data.ssd_presets.SingleShotPreset": "cocodet.transforms.ssd_presets.SingleShotPreset",
    "cocodet.data.ssd_presets.FixedResize": "cocodet.transforms.ssd_presets.FixedResize",
    "cocodet.bench.callback.LoaderTimingCallback": "cocodet.timing.callback.LoaderTimingCallback",
}
# The index package, renamed coco/ -> datasets/ once it held every layout: module -> its public
# names; those that also changed module are listed after.
_DATASETS = {"index": ("CocoIndex", "DatasetConfigError", "build_index", "load_coco_json"),
             "index_cache": ("cached_index", "through_cache", "index_key"),
             "bad_samples": ("BadSampleLedger", "skip_record", "append_records"), "synthetic": ("ensure_synthetic",),
             "yolo_index": ("yolo_splits", "split_index", "list_images", "files_key", "image_ids", "build_split_index",
                            "write_ground_truth"),
             "yolo_labels": ("Labels", "label_path", "read_labels"),
             "yolo_yaml": ("YoloLayout", "resolve", "parent", "find_data_yaml", "read_data_yaml")}
MOVED_TARGETS.update({f"cocodet.coco.{module}.{name}": f"cocodet.datasets.{module}.{name}"
                      for module, names in _DATASETS.items() for name in names})
MOVED_TARGETS.update({"cocodet.coco.index.resolve_inside": "cocodet.datasets.paths.resolve_inside",
                      "cocodet.coco.index.remote_inside": "cocodet.datasets.paths.remote_inside",
                      "cocodet.coco.splits.annotation_file": "cocodet.datasets.coco_layout.annotation_file"})
_warned: set[str] = set()


def current_targets(tree: dict) -> list[str]:
    """Rewrite, in place, each ``_target_`` of ``tree`` (the config as plain Python) that names a
    moved class; the keys rewritten (``augment._target_``, ...)."""
    rewritten = []
    for key, node, old in targets_in(tree, ""):
        new = MOVED_TARGETS.get(old) if isinstance(old, str) else None
        if new is None:
            continue
        node["_target_"] = new
        rewritten.append(key)
        if old not in _warned:
            _warned.add(old)
            log.warning("%s=%s is an old path: the class is %s now; name that in your config (the old path is "
                        "mapped for you)", key, old, new)
    return rewritten


def targets_in(node, prefix: str):
    """(dotted key, the dict that holds it, value) of every ``_target_`` under ``node``, a plain
    container (listed first: the rewrite changes the dicts)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            found += [(path, node, value)] if key == "_target_" else targets_in(value, path)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += targets_in(value, f"{prefix}.{i}")
    return found
