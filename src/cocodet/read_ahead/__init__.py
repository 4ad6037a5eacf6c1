"""The read-ahead of a remote root (design §15): one thread per rank fetches, in the order the
sampler and the dataset's partner sources plan, the objects this rank will read, into a
node-local folder of copies. The train dataset's image reader reads the split through them
(``data/image_reader.py``'s ``copies``, handed to ``storage/store.read_bytes`` as ``via``): no
module-level switch routes reads, so nothing else a process reads goes through them.

- ``start.py``: the plan of reads (``epoch_reads``) and ``start_read_ahead``, which sizes,
  claims and starts it; the datamodule calls ``start_train_read_ahead`` with the train loader.
- ``budget.py``: how much it may hold (``dataset.remote.cache_bytes``) and where.
- ``working_set.py``: what the planned epochs keep live at once, and the lead.
- ``object_cache.py``: the copies (claimed, budgeted, evicted only by the fetcher).
- ``fetcher.py``: ``ReadAhead``, the thread.

Above ``storage/`` (which it reads through) and below the datamodule; nothing here imports
torch.
"""
