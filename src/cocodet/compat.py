"""Old ``_target_`` paths, mapped to where their classes live now: one table instead of
re-export modules (design §1).

A user's config copied from an older release may name a class by a path that moved. Before
the config is read (``run_spec/read.py``), every ``_target_`` in it that this table knows is
rewritten to the current path, and the first use of each old path in a process logs one
warning naming the new one. Shipped configs name current paths (tests/test_layout.py).
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf

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
_warned: set[str] = set()


def current_targets(cfg: DictConfig) -> list[str]:
    """Rewrite, in place, each ``_target_`` of ``cfg`` that names a moved class; the keys
    rewritten (``augment._target_``, ...)."""
    rewritten = []
    for key, old in _targets(OmegaConf.to_container(cfg, resolve=False), ""):
        new = MOVED_TARGETS.get(old) if isinstance(old, str) else None
        if new is None:
            continue
        OmegaConf.update(cfg, key, new, merge=False)
        rewritten.append(key)
        if old not in _warned:
            _warned.add(old)
            log.warning("%s=%s is an old path: the class is %s now; name that in your config (the old path is "
                        "mapped for you)", key, old, new)
    return rewritten


def _targets(node, prefix: str):
    """(dotted key, value) of every ``_target_`` under ``node``, a plain container."""
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if key == "_target_":
                yield path, value
            else:
                yield from _targets(value, path)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _targets(value, f"{prefix}.{i}")
