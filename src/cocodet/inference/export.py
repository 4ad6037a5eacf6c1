"""mode=export: the detector as a file that runs without cocodet, with its metadata and a
standalone predict script (numpy, OpenCV and the runtime only).

The network takes float RGB images in [0, 1]; the letterbox resize before it and the
mapping of boxes back to the original image after it happen outside the network, in the
shipped ``predict.py``, exactly as ``mode=predict`` does them.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch

from cocodet import schema
from cocodet.errors import UserError
from cocodet.data.augment import PAD_VALUE

log = logging.getLogger(__name__)
STANDALONE = Path(__file__).with_name("standalone_predict.py")


class ExportError(UserError):
    """The model cannot be exported in the asked format."""


def export(module, datamodule, *, fmt: str, model_name: str, run_dir: Path, opset: int) -> dict:
    if datamodule.eval_recipe.decode_size is None:
        raise ExportError(f"mode=export writes a predict.py that letterboxes to dataset.image_size, and this model was "
                          f"trained with {type(datamodule.train_set.recipe).__name__} (the model's own resize, "
                          f"{datamodule.eval_recipe.model_sizes[0]}/{datamodule.eval_recipe.model_sizes[1]}): it would "
                          "be fed differently from how it was trained. Use mode=predict for this model, or export a "
                          "model trained with augment=mosaic|basic|none")
    out = run_dir / "export"
    out.mkdir(parents=True, exist_ok=True)
    model = module.model.cpu().eval()
    size = datamodule.image_size
    if fmt == "torchscript":
        path = out / "model.torchscript.pt"
        torch.jit.script(model).save(str(path))
    elif schema.check("export.format", fmt) == "onnx":
        path = out / "model.onnx"
        _export_onnx(model, size, path, opset)
    meta = {
        "format": fmt, "model": model_name, "file": path.name,
        "input": {"dtype": "float32", "range": [0.0, 1.0], "channels": "RGB", "layout": "CHW",
                  "size": size, "pad_value": PAD_VALUE,
                  "letterbox": f"resize the long side to {size} keeping the aspect ratio (INTER_AREA when "
                               f"shrinking; a JPEG at least 2x/4x/8x larger decoded at 1/2, 1/4, 1/8 first), "
                               f"pad bottom/right with {PAD_VALUE} to {size}x{size}"},
        "output": "boxes xyxy in the letterboxed frame, labels 1..K (0: background), scores; divide boxes by "
                  "the resize scale and clip to the original image",
        "categories": [{"label": k + 1, "id": int(c), "name": n}
                       for k, (c, n) in enumerate(zip(datamodule.val_index.category_ids.tolist(),
                                                      datamodule.val_index.category_names))],
    }
    (out / "model.json").write_text(json.dumps(meta, indent=2))
    shutil.copyfile(STANDALONE, out / "predict.py")
    log.info("exported %s to %s (+ model.json, predict.py): python %s --model %s IMAGE...", fmt, path,
             out / "predict.py", path)
    return {"mode": "export", "format": fmt, "model_file": str(path), "metadata": str(out / "model.json"),
            "predict_script": str(out / "predict.py"), "bytes": path.stat().st_size}


def _export_onnx(model: torch.nn.Module, size: int, path: Path, opset: int) -> None:
    try:
        import onnx  # noqa: F401  (the exporter needs it; named here to say so)
    except ImportError as e:
        raise ExportError("export.format=onnx needs the onnx extra: pip install '.[onnx]'") from e
    example = [torch.rand(3, size, size)]
    with torch.no_grad():
        keys = list(model(example)[0].keys())  # the detector's own output order (FCOS: boxes, scores, labels)
    # The TorchScript-based exporter: torch.onnx's dynamo exporter does not trace torchvision's
    # detection postprocessing (data-dependent NMS) in torch 2.14.
    torch.onnx.export(model, (example,), str(path), opset_version=opset, input_names=["image"],
                      output_names=keys, dynamo=False)
