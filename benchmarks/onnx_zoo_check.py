"""Which detectors of the zoo export to ONNX (torch's TorchScript-based exporter) and run in
onnxruntime with the same detections as eager PyTorch, at one opset; random weights.

    python benchmarks/onnx_zoo_check.py --size 320 --opset 17

Prints one line per model: exported or the exporter's error, then the largest box
difference against eager on one image (scores are compared through the boxes they keep).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from cocodet.inference.export import _export_onnx
from cocodet.models.zoo import BUILDERS, build_detector


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=320)
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--models", nargs="*", default=sorted(BUILDERS))
    args = p.parse_args()
    import onnxruntime as ort

    torch.manual_seed(0)
    image = torch.rand(3, args.size, args.size)
    print(f"| model | opset {args.opset} export | onnxruntime vs eager: max box diff (px) | boxes | export s |")
    print("|---|---|---|---|---|")
    for name in args.models:
        threshold = {"box_score_thresh": 0.0} if name.startswith("fasterrcnn") else {"score_thresh": 0.0}
        model = build_detector(name, num_classes=4, image_size=args.size, **threshold).eval()
        with torch.no_grad():
            eager = model([image])[0]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "m.onnx"
            t0 = time.perf_counter()
            try:
                _export_onnx(model, args.size, path, args.opset)
            except Exception as e:  # noqa: BLE001 - the report is the point
                print(f"| {name} | fails: {type(e).__name__}: {str(e).splitlines()[0][:120]} | | | |")
                continue
            seconds = time.perf_counter() - t0
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            out = dict(zip(names, session.run(None, {session.get_inputs()[0].name: image.numpy()})))
        ours, theirs = eager["boxes"].numpy(), out["boxes"]
        if len(ours) != len(theirs) or not len(ours):
            print(
                f"| {name} | ok | box count differs: eager {len(ours)}, onnxruntime {len(theirs)} | | {seconds:.1f} |"
            )
            continue
        diff = max(np.abs(theirs - b).max(axis=1).min() for b in ours)
        print(f"| {name} | ok | {diff:.2e} | {len(ours)} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
