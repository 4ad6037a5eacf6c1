"""What one resume point costs (issue 72; docs/design.md §7.4, checkpoint.every_n_steps=auto): the
size of a full checkpoint (weights plus SGD's momentum, what resume.ckpt holds besides the small
loop and stream state) of the torchvision reference detectors, and the seconds to write it the
way cocodet does (a temporary file, flushed to disk, renamed into place). With ``--bucket``, the
same checkpoint through the run's writer into a bucket folder (``checkpoint.dir=s3://...``): its
SHA-256 alone, the whole upload (serialising, digest, parts), and a read back (one GET, the
digest checked, ``torch.load``).

    python benchmarks/checkpoint_cost.py --dir /tmp          # a network volume: --dir /mnt/runs
    python benchmarks/checkpoint_cost.py --bucket s3://ckpts/bench --endpoint http://127.0.0.1:9000
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


def bucket_costs(state: dict, folder: str, rounds: int) -> tuple[float, float, float]:
    """Median seconds of (the SHA-256 of the serialised checkpoint, its upload by the run's
    writer, its read back by the modes' reader) in the bucket folder ``folder``."""
    import io

    from cocodet.models.checkpoint_file import load_checkpoint
    from cocodet.models.checkpoint_io import AtomicCheckpointIO
    from cocodet.models.checkpoint_store import digest

    buffer = io.BytesIO()
    torch.save(state, buffer)
    url, medians = f"{folder}/resume.ckpt", []
    for work in (
        lambda: digest(buffer.getbuffer()),
        lambda: AtomicCheckpointIO().save_checkpoint(state, url),
        lambda: load_checkpoint(url, weights_only=True),
    ):
        seconds = []
        for _ in range(rounds):
            start = time.perf_counter()
            work()
            seconds.append(time.perf_counter() - start)
        medians.append(sorted(seconds)[len(seconds) // 2])
    return medians[0], medians[1], medians[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bucket", help="a bucket folder, s3://bucket/prefix: the upload and read back too")
    parser.add_argument("--endpoint", help="its store's endpoint (an S3-compatible store)")
    args = parser.parse_args()
    if args.bucket:
        from cocodet.models import checkpoint_store
        from cocodet.storage import session

        session.configure({})
        checkpoint_store.configure(checkpoint_store.CheckpointFolder(args.bucket, {"endpoint_url": args.endpoint}))
        print(f"| model | checkpoint | local save s | SHA-256 s | upload s | read back s |  (median of {args.rounds})")
        print("|---|---|---|---|---|---|")
    else:
        print("| model | checkpoint | save s (median of %d) |\n|---|---|---|" % args.rounds)
    for name in MODELS:
        state = full_state(name)
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            seconds = sorted(timed_save(state, folder) for _ in range(args.rounds))
            size = os.path.getsize(os.path.join(folder, "resume.ckpt"))
        row = f"| {name} | {size / 2**20:.0f} MiB | {seconds[len(seconds) // 2]:.2f} |"
        if args.bucket:
            row += " %.2f | %.2f | %.2f |" % bucket_costs(state, args.bucket, args.rounds)
        print(row)


if __name__ == "__main__":
    main()
