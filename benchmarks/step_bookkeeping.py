"""What a training step's bookkeeping costs on the training thread, for the code on the path
(run it once per checkout, with PYTHONPATH=<checkout>/src, to compare two):

- the attempts ledger's per-step hook (``AttemptLedger.on_train_batch_end``), microseconds per
  step, in a folder on the disk the run folder would be on (``--dir``);
- the fp16 scaler's skip check: host reads of the scale per step (a device sync each on a GPU);
- a resume's read of its checkpoint (``--ckpt``, e.g. make train's ``last.ckpt``): the time of
  one ``torch.load`` of it; how many times a resume opens it is counted by
  ``tests/test_resume_reads.py`` (``tests/count_opens.py``'s audit hook on ``train.py``).

    python benchmarks/step_bookkeeping.py --ckpt outputs/<day>/<time>/checkpoints/last.ckpt
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from cocodet.elastic.attempts import AttemptLedger
from cocodet.models import detector


def ledger_us_per_step(folder: Path, steps: int) -> float:
    ledger = AttemptLedger(folder)
    ledger.on_train_start(SimpleNamespace(is_global_zero=True, global_step=0), None)
    started = time.perf_counter()
    for step in range(1, steps + 1):
        ledger.on_train_batch_end(SimpleNamespace(is_global_zero=True, global_step=step), None, None, None, step)
    elapsed = time.perf_counter() - started
    ledger.close("completed")
    return elapsed / steps * 1e6


def scale_reads_per_step(steps: int = 200) -> float:
    """DetectorModule.optimizer_step's own code around a real fp16 step of a small model (CPU
    GradScaler): host reads of a tensor per step (``.item()``, ``bool()``) beyond the step's own.
    Each is a device sync on a GPU; on this CPU their time (a few microseconds) is below the
    step's noise, so it is not reported."""
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")

    def closure():
        optimizer.zero_grad()
        scaler.scale(model(torch.ones(4, 8)).square().mean()).backward()

    class Step:  # what LightningModule.optimizer_step's optimizer does under fp16
        def step(self, closure):
            closure()
            scaler.step(optimizer)
            scaler.update()

    module = object.__new__(detector.DetectorModule)
    torch.nn.Module.__init__(module)
    module._scaler = lambda: scaler
    module.health = SimpleNamespace(last_step_skipped=False, amp_skip=lambda: None)
    module._window_buffers = SimpleNamespace(restore=lambda: None)
    reads = [0]
    item, to_bool = torch.Tensor.item, torch.Tensor.__bool__

    def counted(real):
        def read(self, *args):
            reads[0] += 1
            return real(self, *args)

        return read

    def run(step) -> float:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - started) / steps * 1e6

    torch.Tensor.item, torch.Tensor.__bool__ = counted(item), counted(to_bool)
    try:
        reads[0] = 0
        run(lambda: module.optimizer_step(0, 0, Step(), closure))
        per_step = reads[0] / steps
        reads[0] = 0
        plain_reads = (run(lambda: Step().step(closure)), reads[0] / steps)[1]
    finally:
        torch.Tensor.item, torch.Tensor.__bool__ = item, to_bool
    return per_step - plain_reads


def load_s(ckpt: Path, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        torch.load(ckpt, map_location="cpu", weights_only=True)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("."), help="where the ledger is written (the run's disk)")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--ckpt", type=Path, help="a checkpoint of the default model, for the resume's reads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        ledger = sorted(ledger_us_per_step(Path(folder) / str(k), args.steps) for k in range(3))
    reads = scale_reads_per_step()
    print(f"code: {Path(detector.__file__).parents[2]}")
    print(f"attempts ledger per step: {ledger[1]:.1f} us (median of 3 x {args.steps} steps: {ledger})")
    print(f"fp16 skip check: {reads:g} host reads of the scale per step")
    if args.ckpt:
        size = args.ckpt.stat().st_size / 2**20
        print(f"one torch.load of {args.ckpt.name} ({size:.0f} MiB, page cache): {load_s(args.ckpt):.3f} s")


if __name__ == "__main__":
    main()
