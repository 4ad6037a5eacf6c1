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
    "cocodet.data.augment.Letterbox": "cocodet.transforms.recipe.Letterbox",
    "cocodet.data.augment.Mosaic": "cocodet.transforms.augment.Mosaic",
    "cocodet.data.datamodule.CocoDataModule": "cocodet.datamodule.CocoDataModule",
    "cocodet.data.reference_presets.HFlip": "cocodet.transforms.reference_presets.HFlip",
    "cocodet.data.reference_presets.MultiScale": "cocodet.transforms.reference_presets.MultiScale",
    "cocodet.data.reference_presets.LargeScaleJitter": "cocodet.transforms.reference_presets.LargeScaleJitter",
    "cocodet.data.reference_presets.ModelResize": "cocodet.transforms.reference_presets.ModelResize",
    "cocodet.data.ssd_presets.SingleShotPreset": "cocodet.transforms.ssd_presets.SingleShotPreset",
    "cocodet.data.ssd_presets.FixedResize": "cocodet.transforms.ssd_presets.FixedResize",
    "cocodet.bench.callback.LoaderTimingCallback": "cocodet.timing.callback.LoaderTimingCallback",
    # transforms/augment.py imported Letterbox for its users; it lives in (and is named from) recipe.py.
    "cocodet.transforms.augment.Letterbox": "cocodet.transforms.recipe.Letterbox",
}
# The index package, renamed coco/ -> datasets/ once it held every layout: module -> its public
# names; those that also changed module are listed after.
_DATASETS = {
    "index": ("CocoIndex", "DatasetConfigError", "build_index", "load_coco_json"),
    "index_cache": ("cached_index", "through_cache", "index_key"),
    "bad_samples": ("BadSampleLedger", "skip_record", "append_records"),
    "synthetic": ("ensure_synthetic",),
    "yolo_index": (
        "yolo_splits",
        "split_index",
        "list_images",
        "files_key",
        "image_ids",
        "build_split_index",
        "write_ground_truth",
    ),
    "yolo_labels": ("Labels", "label_path", "read_labels"),
    "yolo_yaml": ("YoloLayout", "resolve", "parent", "find_data_yaml", "read_data_yaml"),
}
MOVED_TARGETS.update(
    {
        f"cocodet.coco.{module}.{name}": f"cocodet.datasets.{module}.{name}"
        for module, names in _DATASETS.items()
        for name in names
    }
)
MOVED_TARGETS.update(
    {
        "cocodet.coco.index.resolve_inside": "cocodet.datasets.paths.resolve_inside",
        "cocodet.coco.index.remote_inside": "cocodet.datasets.paths.remote_inside",
        "cocodet.coco.splits.annotation_file": "cocodet.datasets.coco_layout.annotation_file",
    }
)
# loader/ in rooms: what the plan needs (loader/plan/, no torch) and what handles failures
# (loader/failures/): old module -> (new module, its public names); names that changed module after.
LOADER_MOVES = {
    "plan_record": (
        "plan.records",
        (
            "WorkerCap",
            "ShmCheck",
            "Budget",
            "LoaderDraft",
            "Window",
            "LoaderRequest",
            "RecipeShape",
            "BatchGeometry",
            "LoaderPlan",
        ),
    ),
    "plan_table": ("plan.table", ("shm_split_text", "side_text", "plan_table")),
    "plan_reasons": (
        "plan.reasons",
        (
            "explain",
            "shm_size_for",
            "cpu_reason",
            "no_shm_reason",
            "shm_reason",
            "in_parts",
            "in_process",
            "memory_reason",
            "over_cpus",
            "over_shm",
            "over_memory",
            "near_nofile",
            "near_max_map_count",
            "window_note",
        ),
    ),
    "budget": (
        "plan.budget",
        (
            "shm_budget",
            "host_budget",
            "loader_draft",
            "parts_that_fit",
            "memory_limit",
            "worker_memory",
            "inflight_fds",
            "explicit_part_images",
            "decide_workers",
            "window_cache",
            "finished_plan",
        ),
    ),
    "policy": ("plan.policy", ("plan_loader",)),
    "pod_requests": ("plan.pod_requests", ("pod_requests", "pod_requests_text")),
    "resources": ("plan.resources", ("HostResources", "shm_space", "probe", "raise_nofile_limit")),
    "window_plan": ("plan.window_slots", ("window_slots",)),
    "flat_layout": ("plan.flat_layout", ("round_up", "batch_bytes", "batch_geometry")),
    "worker_request": ("plan.request", ("loader_request", "worker_request")),
    "diagnose": ("failures.diagnose", ("LoaderFailure", "explain", "explained_loader_failures")),
    "replan": ("failures.replan", ("default_on_failure", "next_rung", "describe", "Replanner")),
    "hang": ("failures.hang", ("LoaderTimeout", "stacks_dir", "register_stack_dump", "worker_stacks", "watchdog")),
    "worker_deaths": ("failures.worker_deaths", ("WorkerDied", "dead_worker_error", "fetching")),
    "worker_shutdown": ("failures.worker_shutdown", ("shut_down_workers",)),
}
MOVED_TARGETS.update(
    {
        f"cocodet.loader.{old}.{name}": f"cocodet.loader.{new}.{name}"
        for old, (new, names) in LOADER_MOVES.items()
        for name in names
    }
)
MOVED_TARGETS.update(
    {
        f"cocodet.loader.diagnose.{name}": f"cocodet.loader.failures.classify.{name}"
        for name in ("full_disk_path", "classify", "worker_signals", "failure_kind")
    }
)
MOVED_TARGETS.update(
    {f"cocodet.loader.window_plan.{name}": f"cocodet.window_slot.{name}" for name in ("slot_pixels", "slot_bytes")}
)
MOVED_TARGETS["cocodet.loader.flat_batch.PartJoiner"] = "cocodet.loader.part_joiner.PartJoiner"
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
            log.warning(
                "%s=%s is an old path: the class is %s now; name that in your config (the old path is mapped for you)",
                key,
                old,
                new,
            )
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
