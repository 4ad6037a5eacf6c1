"""Run an exported cocodet detector on images; needs numpy, OpenCV and the model's runtime
(torch and torchvision for TorchScript, onnxruntime for ONNX), not cocodet.

    python predict.py --model model.torchscript.pt IMAGE [IMAGE ...] [--score 0.3] [--out results.json]

Prints (or writes) one JSON list of {"file", "bbox" [x, y, w, h] in the original image's
pixels, "category_id", "category", "score"}. The preprocessing is cocodet's validation
path: decode (reduced JPEG decode when the image is at least 2x larger than the input),
letterbox resize of the long side, grey padding bottom/right; boxes are mapped back by the
resize scale and clipped to the image.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cv2
import numpy as np

REDUCED = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
           8: cv2.IMREAD_REDUCED_COLOR_8}


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from a JPEG's start-of-frame marker; None when not found."""
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return None
        marker, length = data[i + 1], int.from_bytes(data[i + 2:i + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            return int.from_bytes(data[i + 5:i + 7], "big"), int.from_bytes(data[i + 7:i + 9], "big")
        i += 2 + length
    return None


def preprocess(path: str, size: int, pad_value: int) -> tuple[np.ndarray, tuple[int, int], float]:
    data = Path(path).read_bytes()
    reduction, stored = 1, jpeg_size(data) if data[:2] == b"\xff\xd8" else None
    if stored:
        for factor in (8, 4, 2):
            if max(stored) // factor >= size:
                reduction = factor
                break
    image = cv2.imdecode(np.frombuffer(data, np.uint8), REDUCED[reduction] | cv2.IMREAD_IGNORE_ORIENTATION)
    if image is None:
        raise ValueError(f"{path}: not a decodable image")
    image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    h, w = image.shape[:2]
    orig = stored if reduction > 1 else (h, w)
    r = size / max(h, w)
    nh, nw = max(1, round(h * r)), max(1, round(w * r))
    if (nh, nw) != (h, w):
        image = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_AREA if r < 1 else cv2.INTER_LINEAR)
    canvas = np.full((size, size, 3), pad_value, np.uint8)
    canvas[:nh, :nw] = image
    return canvas.transpose(2, 0, 1).astype(np.float32) / np.float32(255.0), orig, r / reduction


def load_runner(model_path: str, device: str = "cpu"):
    """A function image -> (boxes, labels, scores) on ``device`` ("cpu" or "cuda"). For ONNX,
    "cuda" asks onnxruntime for its CUDAExecutionProvider and refuses to fall back silently."""
    if model_path.endswith(".onnx"):
        import onnxruntime as ort

        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
        session = ort.InferenceSession(model_path, providers=providers)
        if device == "cuda" and session.get_providers()[0] != "CUDAExecutionProvider":
            raise RuntimeError(f"--device cuda: onnxruntime {ort.__version__} runs this model on "
                               f"{session.get_providers()} (available: {ort.get_available_providers()}); "
                               "install onnxruntime-gpu built for this host's CUDA")
        sys.stderr.write(f"onnxruntime provider: {session.get_providers()[0]}\n")
        name = session.get_inputs()[0].name

        outputs = [o.name for o in session.get_outputs()]

        def run(x):
            out = dict(zip(outputs, session.run(None, {name: x})))
            return out["boxes"], out["labels"], out["scores"]
        return run
    import torch
    import torchvision  # noqa: F401  (registers the ops the scripted detector calls: nms, roi_align)

    model = torch.jit.load(model_path, map_location=device).eval()
    sys.stderr.write(f"torchscript device: {device}\n")

    def run(x):
        with torch.no_grad():
            out = model([torch.from_numpy(x).to(device)])
        out = out[1] if isinstance(out, tuple) else out  # scripted detectors return (losses, detections)
        return tuple(out[0][k].cpu().numpy() for k in ("boxes", "labels", "scores"))
    return run


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("images", nargs="+")
    p.add_argument("--model", required=True)
    p.add_argument("--meta", help="model.json (default: beside the model)")
    p.add_argument("--score", type=float, default=0.0)
    p.add_argument("--out", help="write the JSON here instead of printing it")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model runs")
    args = p.parse_args(argv)
    meta = json.loads(Path(args.meta or Path(args.model).with_name("model.json")).read_text())
    size, pad = meta["input"]["size"], meta["input"]["pad_value"]
    categories = {c["label"]: c for c in meta["categories"]}
    run = load_runner(args.model, args.device)
    results = []
    for path in args.images:
        x, (h, w), scale = preprocess(path, size, pad)
        boxes, labels, scores = run(x)
        for box, label, score in zip(boxes, labels, scores):
            if int(label) == 0 or float(score) < args.score:
                continue
            x0, y0, x1, y1 = (np.asarray(box, np.float64) / scale).tolist()
            x0, x1 = min(max(x0, 0.0), w), min(max(x1, 0.0), w)
            y0, y1 = min(max(y0, 0.0), h), min(max(y1, 0.0), h)
            category = categories[int(label)]
            results.append({"file": path, "bbox": [x0, y0, x1 - x0, y1 - y0], "category_id": category["id"],
                            "category": category["name"], "score": float(score)})
    text = json.dumps(results)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text + "\n")
    return results


if __name__ == "__main__":
    main()
