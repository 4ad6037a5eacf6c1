"""Re-export: ``cocodet.bench.callback.LoaderTimingCallback`` was the class path shipped configs
named before the re-layout; user configs that copied it keep working. The class is ``cocodet.timing.callback``'s."""

from cocodet.timing.callback import LoaderTimingCallback  # noqa: F401
