"""What undoing a skipped step costs on every step (issue 69, design §12), side by side in one
run: a CPU training step of the model (forward, backward, AdamW) against the guard's own work
on every optimizer step, the buffer snapshot (``BufferSnapshot.take``) and the gradient
verdict (``gradients_finite``: the gradients' total L2 norm and one host sync). The restore
runs only on a skipped step and is timed apart.

    python benchmarks/skipped_step_cost.py                       # the default model and fcos_resnet50_fpn
    python benchmarks/skipped_step_cost.py --size 128 --batch 8 --steps 5
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from cocodet.models.skipped_step import BufferSnapshot, gradient_norm, gradients_finite
from cocodet.models.zoo import build_detector


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    return sorted(times)[len(times) // 2]


def measure(name: str, size: int, batch: int, steps: int, repeats: int) -> dict:
    torch.manual_seed(0)
    model = build_detector(name, num_classes=4, image_size=size).train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    images = [torch.rand(3, size, size) for _ in range(batch)]
    box = torch.tensor([[size * 0.1, size * 0.1, size * 0.6, size * 0.6]])
    targets = [{"boxes": box, "labels": torch.tensor([1])} for _ in range(batch)]

    def step():
        optimizer.zero_grad()
        sum(model(images, targets).values()).backward()
        optimizer.step()

    step()  # warm-up, and gradients to judge
    step_ms = median_ms(step, steps)
    snapshot = BufferSnapshot(model)
    take_ms = median_ms(snapshot.take, repeats)
    verdict_ms = median_ms(lambda: gradients_finite(gradient_norm(optimizer)), repeats)
    restore_ms = median_ms(snapshot.restore, repeats)
    guard = take_ms + verdict_ms
    return {
        "model": name,
        "size": size,
        "batch": batch,
        "threads": torch.get_num_threads(),
        "buffers": len(snapshot.buffers),
        "buffer_mib": round(sum(b.numel() * b.element_size() for b in snapshot.buffers) / 2**20, 2),
        "step_ms": round(step_ms, 1),
        "snapshot_ms": round(take_ms, 3),
        "verdict_ms": round(verdict_ms, 3),
        "per_step_ms": round(guard, 3),
        "share_of_step": f"{guard / step_ms:.3%}",
        "restore_ms_when_skipped": round(restore_ms, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["fcos_resnet18_fpn", "fcos_resnet50_fpn"])
    parser.add_argument("--size", type=int, default=128, help="the synthetic set's dataset.image_size")
    parser.add_argument("--batch", type=int, default=8, help="loader.batch_size's default")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    for name in args.models:
        print(json.dumps(measure(name, args.size, args.batch, args.steps, args.repeats)), flush=True)


if __name__ == "__main__":
    main()
