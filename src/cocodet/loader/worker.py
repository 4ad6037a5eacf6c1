"""Worker hygiene: one thread per worker, OpenCV threads and OpenCL off, seeded RNGs.

Passing our own worker_init_fn turns Lightning's worker seeding off, so this seeds Python,
numpy and torch itself. The data recipe does not use those generators (it draws from
per-sample generators, design §5); seeding them keeps user code in workers reproducible.
"""

from __future__ import annotations

import random
import signal

import cv2
import numpy as np
import torch

from cocodet.loader.failures.hang import register_stack_dump


def worker_init_fn(worker_id: int) -> None:
    # A Ctrl-C in a terminal reaches every process of its group: the main process decides
    # (resume.ckpt, then stop); a worker that died of it would read as a loader failure.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # N workers each running a full intra-op pool oversubscribe the cores N-fold.
    torch.set_num_threads(1)
    cv2.setNumThreads(0)  # OpenCV's own pool deadlocks/oversubscribes under fork
    cv2.ocl.setUseOpenCL(False)
    register_stack_dump()  # a loader timeout can then show where this worker is stuck
    seed = torch.initial_seed() % 2**32  # base_seed + worker_id, set by the DataLoader
    random.seed(seed)
    np.random.seed(seed)
