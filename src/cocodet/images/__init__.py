"""Pixels: an image's header checked, its bytes decoded (the one decode), resized (the one resize)
and read with its clipped targets; ``dataset.verify`` scans them.

Imports ``cocodet.datasets``, ``cocodet.storage`` and the bottom layer; never transforms or torch.
"""
