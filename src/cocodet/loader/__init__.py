"""Planning and moving batches, in rooms: ``plan/`` (the loader plan against the host: records,
budget, caps and their words, the pod's requests; imports no torch, so ``mode=plan`` stays
light), ``failures/`` (diagnosis, re-plan, hangs, worker deaths and shutdown), and here the
samplers and batch sampler of each rank's epoch, the workers, the FlatBatch and its resumable
stream.

Imports only the bottom layer (``errors``, ``sample``, ``ranks``, ``units``, ``host``, ``schema``,
``window_slot``); never the data packages.
"""
