"""The datasets: each layout (``layouts.py``) read into one flat index in COCO's form
(``CocoIndex``) with the ground truth COCOeval scores it by, cached; the split loader every mode
reads through (``splits.py``), the synthetic dataset, and the ledger of bad samples.

Imports ``cocodet.storage`` and the bottom layer; never pixels, transforms or torch.
"""
