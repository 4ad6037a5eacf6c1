"""Re-export: ``cocodet.data.ssd_presets.*`` were the class paths shipped configs named before the
re-layout; user configs that copied them keep working. The classes are ``cocodet.transforms.ssd_presets``'."""

from cocodet.transforms.ssd_presets import FixedResize, SingleShotPreset  # noqa: F401
