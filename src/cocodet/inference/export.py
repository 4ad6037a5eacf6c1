"""mode=export: the detector as a file that runs without cocodet, with its metadata and a
standalone predict script (numpy, OpenCV and the runtime only).

The network takes float RGB images in [0, 1]; the resize before it (validation's: the
letterbox, the model's shortest-side resize with augment=hflip|multiscale|lsj, or an SSD's
fixed square with augment=ssd|ssdlite; ``model.json``'s ``input.resize``) and the mapping of
boxes back to the original image after it happen outside the network, in the shipped
``predict.py``, exactly as ``mode=predict`` does them.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch

from cocodet import schema
from cocodet.errors import UserError

log = logging.getLogger(__name__)
STANDALONE = Path(__file__).with_name("standalone_predict.py")


class ExportError(UserError):
    """The model cannot be exported in the asked format."""


# What the standalone script does before the network, per kind of resize (model.json's input.resize).
RESIZE_WORDS = {
    "letterbox": "resize the long side to {size} keeping the aspect ratio (INTER_AREA when shrinking; a JPEG at "
    "least 2x/4x/8x larger decoded at 1/2, 1/4, 1/8 first), pad bottom/right with {pad_value} to "
    "{size}x{size}",
    "shortest_side": "resize to floor(side x s) with s = min({min_size} / shorter side, {max_size} / longer side), "
    "bilinear without antialias on uint8 (torch's interpolate, align_corners=False), no padding",
    "fixed": "resize to {height}x{width} without keeping the aspect ratio, bilinear without antialias on uint8 "
    "(torch's interpolate, align_corners=False)",
}


def export(module, datamodule, *, fmt: str, model_name: str, run_dir: Path, opset: int) -> dict:
    resize = datamodule.eval_recipe.export_resize()  # as validation fed the model (design §13)
    out = run_dir / "export"
    out.mkdir(parents=True, exist_ok=True)
    model = module.model.cpu().eval()
    if fmt == "torchscript":
        path = out / "model.torchscript.pt"
        torch.jit.script(model).save(str(path))
    elif schema.check("export.format", fmt) == "onnx":
        path = out / "model.onnx"
        _export_onnx(model, resize, path, opset)
    letterbox = resize["kind"] == "letterbox"
    meta = {
        "format": fmt,
        "model": model_name,
        "file": path.name,
        "input": {
            "dtype": "float32",
            "range": [0.0, 1.0],
            "channels": "RGB",
            "layout": "CHW",
            "size": resize.get("size"),
            "pad_value": resize.get("pad_value"),
            "resize": resize,
            "how": RESIZE_WORDS[resize["kind"]].format(**resize),
        },
        "output": "boxes xyxy in the resized frame, labels 1..K (0: background), scores; divide boxes by the resize "
        "scale" + ("" if letterbox else " of each axis (resized / original side)") + " and clip to the "
        "original image",
        "categories": [
            {"label": k + 1, "id": int(c), "name": n}
            for k, (c, n) in enumerate(
                zip(datamodule.val_index.category_ids.tolist(), datamodule.val_index.category_names)
            )
        ],
    }
    (out / "model.json").write_text(json.dumps(meta, indent=2))
    shutil.copyfile(STANDALONE, out / "predict.py")
    log.info(
        "exported %s to %s (+ model.json, predict.py; input: %s): python %s --model %s IMAGE...",
        fmt,
        path,
        meta["input"]["how"],
        out / "predict.py",
        path,
    )
    return {
        "mode": "export",
        "format": fmt,
        "model_file": str(path),
        "metadata": str(out / "model.json"),
        "predict_script": str(out / "predict.py"),
        "bytes": path.stat().st_size,
        "resize": resize,
    }


def _export_onnx(model: torch.nn.Module, resize: dict, path: Path, opset: int) -> None:
    try:
        import onnx  # noqa: F401  (the exporter needs it; named here to say so)
    except ImportError as e:
        raise ExportError("export.format=onnx needs the onnx extra: pip install '.[onnx]'") from e
    if resize["kind"] == "shortest_side":  # every image its own size: height and width stay free
        from cocodet.transforms.model_resize import resized_hw

        hw, dynamic = resized_hw(480, 640, resize["min_size"], resize["max_size"]), {"image": {1: "height", 2: "width"}}
    else:
        hw, dynamic = (resize["height"], resize["width"]) if resize["kind"] == "fixed" else (resize["size"],) * 2, None
    example = [torch.rand(3, *hw)]
    with torch.no_grad():
        keys = list(model(example)[0].keys())  # the detector's own output order (FCOS: boxes, scores, labels)
    # The TorchScript-based exporter: torch.onnx's dynamo exporter does not trace torchvision's
    # detection postprocessing (data-dependent NMS) in torch 2.14.
    torch.onnx.export(
        model,
        (example,),
        str(path),
        opset_version=opset,
        input_names=["image"],
        output_names=keys,
        dynamic_axes=dynamic,
        dynamo=False,
    )
