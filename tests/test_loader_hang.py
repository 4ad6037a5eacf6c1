"""A read that never returns (a FIFO among the images) ends in a LoaderFailure with the
stack at the blocking call: through torch's timeout with a worker, through the watchdog
without one. Real processes, real FIFO."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from conftest import run_train, synthetic_overrides

pytestmark = (
    pytest.mark.slow
)  # it sleeps on a FIFO for loader.timeout: the 60 s bound leaves 50 s for start-up under load

# Seconds the blocked read waits: each of them leaves one of the suite's two cores idle. The
# first batch meets a FIFO whatever the timeout (a forked worker reaches it well within a second).
TIMEOUT_S = 8


@pytest.fixture(scope="module")
def fifo_root(synthetic_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("fifo") / "ds"
    shutil.copytree(synthetic_root, root)
    for image in sorted((root / "train").iterdir())[:2]:  # two, so the first batch meets one
        image.unlink()
        os.mkfifo(image)
    return root


@pytest.mark.parametrize("workers", [1, 0])
def test_blocking_read_ends_in_loader_failure_with_its_stack(fifo_root, tmp_path, workers):
    args = [
        *synthetic_overrides(fifo_root),
        "mode=bench",
        "loader=explicit",
        f"loader.num_workers={workers}",
        f"loader.timeout={TIMEOUT_S}",
        "bench.batches=5",
        "bench.warmup=0",
        "bench.decode_probe=0",
    ]
    started = time.monotonic()
    proc, _ = run_train(args, tmp_path / f"w{workers}", check=False, timeout=120)
    elapsed = time.monotonic() - started
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and elapsed < 60, (elapsed, out[-3000:])
    assert "LoaderFailure" in out and "loading hung" in out and f"loader.timeout={TIMEOUT_S}" in out, out[-4000:]
    assert "load_resized" in out  # the stack shows the sample read that blocked
    if workers:
        assert "--- worker " in out and f"DataLoader timed out after {TIMEOUT_S}" in out
    else:
        assert "in-process watchdog" in out and "Main thread stack" in out
