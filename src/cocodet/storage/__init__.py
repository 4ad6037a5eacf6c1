"""Bytes: where dataset files and objects come from (a local path or a store URL), read through one
chokepoint, bounded and retried, with the read-ahead's node-local copies and cocodet's own cache files.

Imports only the bottom layer (``cocodet.errors``, ``cocodet.units``); never torch, cv2 or image code.
"""
