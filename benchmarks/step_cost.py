"""Seconds per training step of the zoo's fcos_resnet18_fpn on this CPU, side by side in one
run: at each FPN width (model.detector.fpn_channels) on one compute thread and on all of them.

The figures behind two choices of the test suites (docs/benchmarks.md, "The test suites'
time"): two test processes of one thread each do more work than one of two threads, and the
pipeline tests train the 64-channel model.

    python benchmarks/step_cost.py                      # 64 px, batch 8, widths 256 and 64
    python benchmarks/step_cost.py --size 128 --widths 256 128 64
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from cocodet.models.zoo import build_detector


def seconds_per_step(width: int, size: int, batch: int, steps: int, warmup: int = 2) -> float:
    torch.manual_seed(0)
    model = build_detector("fcos_resnet18_fpn", num_classes=4, image_size=size, fpn_channels=width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images = [torch.rand(3, size, size) for _ in range(batch)]
    box = torch.tensor([[size * 0.1, size * 0.1, size * 0.6, size * 0.6]])
    targets = [{"boxes": box, "labels": torch.tensor([1])} for _ in range(batch)]
    for i in range(warmup + steps):
        if i == warmup:
            started = time.perf_counter()
        loss = sum(model(images, targets).values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 64])
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"| fpn_channels | threads | s/step ({args.size} px, batch {args.batch}) |")
    print("|---|---|---|")
    for width in args.widths:
        for threads in sorted({cores, 1}, reverse=True):
            torch.set_num_threads(threads)
            print(
                f"| {width} | {threads} | {seconds_per_step(width, args.size, args.batch, args.steps):.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
