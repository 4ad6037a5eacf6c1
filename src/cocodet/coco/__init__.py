"""The COCO index: annotation files parsed into arrays (``CocoIndex``), cached, split and verified
for keys, the synthetic dataset, and the ledger of bad samples.

Imports ``cocodet.storage`` and the bottom layer; never pixels, transforms or torch.
"""
