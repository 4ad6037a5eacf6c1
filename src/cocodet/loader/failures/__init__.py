"""When the loader fails: what kind of failure (``classify.py``) and its diagnosis with the
numbers (``diagnose.py``), the re-plan after a resource failure, the hang watchdog, worker
deaths and the workers' shutdown."""
