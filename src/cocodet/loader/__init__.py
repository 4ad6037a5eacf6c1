"""Planning and moving batches: the loader plan against the host, the samplers and batch
sampler of each rank's epoch, the workers, the FlatBatch and its resumable stream.

Imports only the bottom layer (``errors``, ``sample``, ``ranks``, ``units``, ``host``, ``schema``); never the data packages.
"""
