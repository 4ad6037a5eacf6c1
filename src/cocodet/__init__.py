"""cocodet: torchvision detectors on COCO-format data with a loader that survives real machines."""

__version__ = "0.1.0"
