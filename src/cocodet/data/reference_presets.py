"""Re-export: ``cocodet.data.reference_presets.*`` were the class paths shipped configs named before
the re-layout; user configs that copied them keep working. The classes are ``cocodet.transforms.reference_presets``'."""

from cocodet.transforms.reference_presets import HFlip, LargeScaleJitter, ModelResize, MultiScale  # noqa: F401
