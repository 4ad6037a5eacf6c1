"""Re-export: ``cocodet.data.augment.Basic|Letterbox|Mosaic`` were the class paths shipped configs
named before the re-layout; user configs that copied them keep working. The classes are ``cocodet.transforms``'."""

from cocodet.transforms.augment import Basic, Letterbox, Mosaic  # noqa: F401
