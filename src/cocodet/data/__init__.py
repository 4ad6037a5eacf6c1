"""Composition: the map-style detection dataset (index -> pixels -> recipe) and the pixel cache
that stores its reads; plus the re-export modules that keep old ``_target_`` paths loading.

Imports every lower package (``storage``, ``coco``, ``images``, ``transforms``) and the loader's samplers.
"""
