"""Run an exported cocodet detector on images; needs numpy, OpenCV and the model's runtime
(torch and torchvision for TorchScript, onnxruntime for ONNX), not cocodet.

    python predict.py --model model.torchscript.pt IMAGE [IMAGE ...] [--score 0.3] [--out results.json]

Prints (or writes) one JSON list of {"file", "bbox" [x, y, w, h] in the original image's
pixels, "category_id", "category", "score"}. The preprocessing is cocodet's validation
path, as model.json's ``input.resize`` records it: the letterbox (reduced JPEG decode when the
image is at least 2x larger than the input, resize of the long side, grey padding
bottom/right), the detector's shortest-side resize, or an SSD's fixed square; boxes are
mapped back by the resize scale of each axis and clipped to the image.

Before any decode, the image's size is read from its header (JPEG, PNG; other formats through
PIL's lazy open when PIL is installed): a file above ``--max-image-pixels`` (default
178956970, PIL's own refusal size and cocodet's ``dataset.max_image_pixels``), such as a
PNG of a few MB that would decode to gigabytes, is skipped with a line on stderr naming it.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import struct
import sys
from pathlib import Path

import cv2
import numpy as np

REDUCED = {
    1: cv2.IMREAD_COLOR,
    2: cv2.IMREAD_REDUCED_COLOR_2,
    4: cv2.IMREAD_REDUCED_COLOR_4,
    8: cv2.IMREAD_REDUCED_COLOR_8,
}
DEFAULT_MAX_IMAGE_PIXELS = 178_956_970
SOF_MARKERS = (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from a JPEG's start-of-frame marker; None when not found."""
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return None
        marker, length = data[i + 1], int.from_bytes(data[i + 2 : i + 4], "big")
        if marker == 0xFF or marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # fill byte, markers without a length
            i += 1 if marker == 0xFF else 2
            continue
        if marker in SOF_MARKERS:
            return int.from_bytes(data[i + 5 : i + 7], "big"), int.from_bytes(data[i + 7 : i + 9], "big")
        i += 2 + length
    return None


def header_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) without decoding: JPEG, PNG, else PIL's lazy open if PIL is installed."""
    if data[:2] == b"\xff\xd8":
        return jpeg_size(data)
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return height, width
    try:
        from PIL import Image
    except ImportError:
        return None
    Image.MAX_IMAGE_PIXELS = None  # the limit applied is ours, below
    try:
        with Image.open(io.BytesIO(data)) as im:  # reads the header only
            return im.size[1], im.size[0]
    except Exception:  # noqa: BLE001 - not a format PIL knows; OpenCV will say what it is
        return None


def read_image(path: str, max_pixels: int, long_side: int | None) -> tuple[np.ndarray, tuple[int, int], int]:
    """(RGB uint8 image, stored (h, w), reduction): decoded at 1/2, 1/4 or 1/8 when a JPEG is
    at least that many times larger than ``long_side`` (None: always at its stored size). Raises
    ValueError, undecoded, for an image whose header is above ``max_pixels``, and for a file
    that is not a decodable image."""
    data = Path(path).read_bytes()
    stored = header_size(data)
    if stored and stored[0] * stored[1] > max_pixels:
        raise ValueError(
            f"too large: the header says {stored[0]}x{stored[1]} = "
            f"{stored[0] * stored[1] / 1e6:.0f} MP, above --max-image-pixels={max_pixels}; not decoded"
        )
    reduction = 1
    if long_side and stored and data[:2] == b"\xff\xd8":
        for factor in (8, 4, 2):
            if max(stored) // factor >= long_side:
                reduction = factor
                break
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), REDUCED[reduction] | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error as e:  # e.g. above OpenCV's own pixel limit
        raise ValueError(f"OpenCV cannot decode it: {str(e).strip().splitlines()[-1]}") from None
    if image is None:
        raise ValueError(f"not a decodable image (first bytes {data[:8]!r})")
    image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    h, w = image.shape[:2]
    if h * w * reduction * reduction > max_pixels:  # a format whose header could not be read
        raise ValueError(f"too large: decoded {h}x{w}, above --max-image-pixels={max_pixels}")
    return image, (stored if reduction > 1 else (h, w)), reduction


def bilinear_uint8(image: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """HxWx3 uint8 resized to ``hw`` as cocodet's loader resizes for the model (torch's bilinear,
    align_corners=False, no antialias, on uint8); OpenCV's INTER_LINEAR, within one level of it,
    where torch is not installed (an ONNX runtime alone)."""
    if tuple(image.shape[:2]) == tuple(hw):
        return image
    try:
        import torch
    except ImportError:
        return cv2.resize(image, (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)
    source = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None]  # the loader's layout
    out = torch.nn.functional.interpolate(source, size=tuple(hw), mode="bilinear", align_corners=False, antialias=False)
    return out[0].permute(1, 2, 0).contiguous().numpy()


def preprocess(
    path: str, resize: dict, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
) -> tuple[np.ndarray, tuple[int, int], tuple[float, float]]:
    """The model's input for one file, as validation made it (``resize``: model.json's
    ``input.resize``), its stored (h, w) and the (y, x) scales from stored to input pixels."""
    kind = resize["kind"]
    image, orig, reduction = read_image(path, max_pixels, resize["size"] if kind == "letterbox" else None)
    h, w = image.shape[:2]
    if kind == "letterbox":
        size, r = resize["size"], resize["size"] / max(h, w)
        nh, nw = max(1, round(h * r)), max(1, round(w * r))
        if (nh, nw) != (h, w):
            image = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_AREA if r < 1 else cv2.INTER_LINEAR)
        canvas = np.full((size, size, 3), resize["pad_value"], np.uint8)
        canvas[:nh, :nw] = image
        return canvas.transpose(2, 0, 1).astype(np.float32) / np.float32(255.0), orig, (r / reduction,) * 2
    if kind == "shortest_side":  # the detector's own transform's arithmetic (Python floats, floor)
        s = min(resize["min_size"] / min(h, w), resize["max_size"] / max(h, w))
        hw = (int(math.floor(h * s)), int(math.floor(w * s)))
    elif kind == "fixed":
        hw = (resize["height"], resize["width"])
    else:
        raise ValueError(
            f"model.json: unknown input.resize kind {kind!r} (this predict.py knows letterbox, shortest_side, fixed)"
        )
    image = bilinear_uint8(image, hw)
    scale = (float(np.float32(hw[0]) / np.float32(h)), float(np.float32(hw[1]) / np.float32(w)))
    return image.transpose(2, 0, 1).astype(np.float32) / np.float32(255.0), orig, scale


def load_runner(model_path: str, device: str = "cpu"):
    """A function image -> (boxes, labels, scores) on ``device`` ("cpu" or "cuda"). For ONNX,
    "cuda" asks onnxruntime for its CUDAExecutionProvider and refuses to fall back silently."""
    if model_path.endswith(".onnx"):
        import onnxruntime as ort

        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
        session = ort.InferenceSession(model_path, providers=providers)
        if device == "cuda" and session.get_providers()[0] != "CUDAExecutionProvider":
            raise RuntimeError(
                f"--device cuda: onnxruntime {ort.__version__} runs this model on "
                f"{session.get_providers()} (available: {ort.get_available_providers()}); "
                "install onnxruntime-gpu built for this host's CUDA"
            )
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
    p.add_argument(
        "--max-image-pixels",
        type=int,
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="skip, undecoded, an image whose header says it has more pixels (default %(default)s)",
    )
    args = p.parse_args(argv)
    meta = json.loads(Path(args.meta or Path(args.model).with_name("model.json")).read_text())
    spec = meta["input"]
    # Files exported before input.resize existed: the letterbox, then the only kind.
    resize = spec.get("resize") or {"kind": "letterbox", "size": spec["size"], "pad_value": spec["pad_value"]}
    categories = {c["label"]: c for c in meta["categories"]}
    run = load_runner(args.model, args.device)
    results = []
    for path in args.images:
        try:
            x, (h, w), (sy, sx) = preprocess(path, resize, args.max_image_pixels)
        except (OSError, ValueError) as e:  # one bad file does not end a folder's run
            sys.stderr.write(f"skipped {path}: {getattr(e, 'strerror', None) or e}\n")
            continue
        boxes, labels, scores = run(x)
        for box, label, score in zip(boxes, labels, scores):
            if int(label) == 0 or float(score) < args.score:
                continue
            x0, y0, x1, y1 = (np.asarray(box, np.float64) / np.array([sx, sy, sx, sy])).tolist()
            x0, x1 = min(max(x0, 0.0), w), min(max(x1, 0.0), w)
            y0, y1 = min(max(y0, 0.0), h), min(max(y1, 0.0), h)
            category = categories[int(label)]
            results.append(
                {
                    "file": path,
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "category_id": category["id"],
                    "category": category["name"],
                    "score": float(score),
                }
            )
    text = json.dumps(results)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text + "\n")
    return results


if __name__ == "__main__":
    main()
