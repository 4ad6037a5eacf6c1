"""Re-export: ``cocodet.data.datamodule.CocoDataModule`` was the class path shipped configs named
before the re-layout; user configs that copied it keep working. The class is ``cocodet.datamodule``'s."""

from cocodet.datamodule import CocoDataModule  # noqa: F401
