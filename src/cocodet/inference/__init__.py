"""Using a trained checkpoint: ``mode=eval``, ``mode=predict``, ``mode=export``."""
