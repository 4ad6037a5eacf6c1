"""cocodet: torchvision detectors on COCO-format data with a loader that survives real machines."""

__version__ = "0.1.0"


def _register_config_parts() -> None:
    """``${cocodet.checkout:}`` (logger=mlflow's default store) and ``${cocodet_run_dir:}`` resolve, and the
    groups' schemas (``run_spec/schemas.py``) are found, in every config cocodet composes: train.py's, and
    Hydra's compose API in a notebook or a test."""
    from cocodet.elastic import run_folder
    from cocodet.run_spec.schemas import register
    from cocodet.tracking.store import register_resolvers

    register_resolvers()
    run_folder.register()  # hydra.run.dir's default: one folder for every node and restart (elastic/run_folder.py)
    register()


_register_config_parts()
