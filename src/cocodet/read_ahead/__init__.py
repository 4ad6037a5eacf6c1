"""The read-ahead of a remote root (design §15): one thread per rank fetches, in the order the
sampler and the dataset's partner sources plan, the objects this rank will read, into a
node-local folder of copies. The train dataset's image reader reads the split through them
(``data/image_reader.py``'s ``copies``, handed to ``storage/store.read_bytes`` as ``via``): no
module-level switch routes reads, so nothing else a process reads goes through them.

- ``start.py``: the plan of reads (``epoch_reads``) and ``start_read_ahead``, which sizes,
  claims and starts it; the datamodule calls ``start_train_read_ahead`` with the train loader.
- ``budget.py``: how much it may hold (``dataset.remote.cache_bytes``) and where, and the
  shared counter of what it holds.
- ``working_set.py``: what the planned epochs keep live at once, and the lead.
- ``object_cache.py``: the copies (claimed, budgeted, evicted only by the fetcher).
- ``reader_gets.py``: each object's count of GETs by readers, in shared memory.
- ``disk_refusal.py``: whether the copies' disk takes writes.
- ``listing_check.py``: whether fetched bytes are the listing's.
- ``fetcher.py``: ``ReadAhead``, the thread and its GET threads.
- ``fetch_plan.py``: what a pass fetches and evicts.
- ``held_copies.py``: one object's fetch, and the copies already in the folder.

Above ``storage/`` (which it reads through) and below the datamodule; nothing here imports
torch.
"""
