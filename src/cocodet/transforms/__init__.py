"""Augmentation recipes: what each sample becomes (letterbox, mosaic, the torchvision reference
presets, SSD's) and the model's own resize they reproduce.

Imports ``cocodet.images`` and below, ``cocodet.schema``; never torch at module level (``mode=plan``
sizes batches from them).
"""
