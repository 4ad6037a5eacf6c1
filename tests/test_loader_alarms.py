"""The training callback's loader alarms: a stall after warm-up and worker RSS growth, each warned once."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from cocodet.timing.callback import LoaderTimingCallback, rss_growth


def test_loader_alarms_warn_once_on_a_stall_and_on_worker_rss_growth(caplog):
    callback = LoaderTimingCallback(slow_wait_s=0.05)
    module = SimpleNamespace(device=torch.device("cpu"))
    trainer = SimpleNamespace(datamodule=None, global_step=0, current_epoch=0)
    callback.on_train_epoch_start(trainer, module)
    batch = ([torch.zeros(1)],)
    for step, stall in enumerate([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.08, 0.08]):
        trainer.global_step = step
        time.sleep(stall)
        callback.on_train_batch_start(trainer, module, batch, step)
        callback.on_train_batch_end(trainer, module, None, batch, step)
    assert len(callback.alarms) == 1 and "waited" in callback.alarms[0]  # two stalls, one warning
    assert rss_growth(None, 500) is None and abs(rss_growth(500, 650) - 0.3) < 1e-9
