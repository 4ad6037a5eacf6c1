"""``python count_opens.py FILE train.py ARGS...``: train.py run in this process while an audit
hook counts the opens of FILE (``open`` events: Python's ``open``, ``os.open`` and what torch
and fsspec open through them); the count is the last stderr line, ``opens of FILE: N``."""

import atexit
import os
import runpy
import sys

target = os.path.abspath(sys.argv[1])
opens = 0


def count(event: str, args: tuple) -> None:
    global opens
    if event == "open" and isinstance(args[0], (str, bytes)) and os.path.abspath(os.fsdecode(args[0])) == target:
        opens += 1


atexit.register(lambda: sys.stderr.write(f"opens of {target}: {opens}\n"))
sys.addaudithook(count)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
