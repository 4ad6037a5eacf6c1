"""A pytest plugin for timing the suites on a fixed set of tests: it deselects the node ids
listed, one per line, in the file named by $DESELECT_NODEIDS (docs/benchmarks.md, "The test
suites' time": #71's suite time on the tests that existed before it, the tests that #72, #73
and #75 added taken out). Use: `PYTHONPATH=$PWD/benchmarks DESELECT_NODEIDS=FILE
PYTEST_ARGS="-p deselect_nodeids" make test`."""

from __future__ import annotations

import os
from pathlib import Path


def pytest_collection_modifyitems(config, items):
    lines = Path(os.environ["DESELECT_NODEIDS"]).read_text().splitlines()
    listed = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    dropped = [item for item in items if item.nodeid in listed]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.nodeid not in listed]
