"""What one resume point costs (issue 72; docs/design.md §7.4, checkpoint.every_n_steps=auto): the
size of a full checkpoint (weights plus SGD's momentum, what resume.ckpt holds besides the small
loop and stream state) of the torchvision reference detectors, and the seconds to write it the
way cocodet does (a temporary file, flushed to disk, renamed into place).

    python benchmarks/checkpoint_cost.py --dir /tmp          # a network volume: --dir /mnt/runs
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torchvision

MODELS = ("fasterrcnn_resnet50_fpn", "retinanet_resnet50_fpn", "fcos_resnet50_fpn", "fcos_resnet18_fpn")


def full_state(name: str) -> dict:
    if name == "fcos_resnet18_fpn":
        from cocodet.models.zoo import build_detector

        model = build_detector(name, num_classes=91, image_size=640)
    else:
        model = getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for p in model.parameters():
        optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p)
    return {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()]}


def timed_save(state: dict, folder: str) -> float:
    path, temporary = os.path.join(folder, "resume.ckpt"), os.path.join(folder, ".resume.ckpt.tmp")
    start = time.perf_counter()
    with open(temporary, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| model | checkpoint | save s (median of %d) |\n|---|---|---|" % args.rounds)
    for name in MODELS:
        state = full_state(name)
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            seconds = sorted(timed_save(state, folder) for _ in range(args.rounds))
            size = os.path.getsize(os.path.join(folder, "resume.ckpt"))
        print(f"| {name} | {size / 2**20:.0f} MiB | {seconds[len(seconds) // 2]:.2f} |")


if __name__ == "__main__":
    main()
