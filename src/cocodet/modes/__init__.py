"""One function per ``mode``, each in the module of its concern; ``app.run`` dispatches through
:data:`MODE_TABLE`, importing a mode's module only when it runs (so ``mode=plan`` imports
neither torch nor Lightning, and only ``mode=bench`` imports ``cocodet.bench``).

A mode function takes ``(spec, plan, resources)``, the run's ``RunSpec`` (``cocodet/run_spec``),
its loader plan and the probed host, and returns the run's summary. These modules are the
wiring layer: they hand the spec's parts to everything below as plain arguments.
"""

MODE_TABLE = {
    "train": "cocodet.modes.train:train",
    "bench": "cocodet.modes.bench:bench",
    "plan": "cocodet.modes.plan:plan",
    "preview": "cocodet.modes.preview:preview",
    "eval": "cocodet.modes.checkpoint:evaluate",
    "predict": "cocodet.modes.checkpoint:predict",
    "export": "cocodet.modes.checkpoint:export",
    "verify": "cocodet.modes.verify:verify",
}
