"""Composition: the map-style detection dataset (index -> pixels -> recipe) and the pixel cache
that stores its reads (old ``_target_`` paths that pointed here are mapped by ``cocodet/compat.py``).

Imports every lower package (``storage``, ``coco``, ``images``, ``transforms``) and the loader's samplers.
"""
