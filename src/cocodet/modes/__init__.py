"""One function per ``mode``, each in the module of its concern; ``app.run`` dispatches through
:data:`MODE_TABLE`, importing a mode's module only when it runs (so ``mode=plan`` imports
neither torch nor Lightning, and only ``mode=bench`` imports ``cocodet.bench``).

A mode function takes ``(cfg, plan, resources, run_dir)`` and returns the run's summary. These
modules are the wiring layer: they read the config tree and call everything below with plain
arguments.
"""

MODE_TABLE = {
    "train": "cocodet.modes.train:train",
    "bench": "cocodet.modes.bench:bench",
    "plan": "cocodet.modes.plan:plan",
    "preview": "cocodet.modes.preview:preview",
    "eval": "cocodet.modes.checkpoint:evaluate",
    "predict": "cocodet.modes.checkpoint:predict",
    "export": "cocodet.modes.checkpoint:export",
}
MODES = tuple(MODE_TABLE)
