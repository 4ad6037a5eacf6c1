"""cocodet: torchvision detectors on COCO-format data with a loader that survives real machines."""

__version__ = "0.1.0"


def _register_config_parts() -> None:
    """``${cocodet.checkout:}`` (logger=mlflow's default store) resolves, and the groups' schemas
    (``run_spec/schemas.py``) are found, in every config cocodet composes: train.py's, and
    Hydra's compose API in a notebook or a test."""
    from cocodet.run_spec.schemas import register
    from cocodet.tracking.store import register_resolvers

    register_resolvers()
    register()


_register_config_parts()
