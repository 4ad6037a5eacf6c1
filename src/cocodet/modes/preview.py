"""mode=preview: PNG grids of real train batches, drawn from the restored FlatBatches."""

from __future__ import annotations


from cocodet.loader.plan_record import LoaderPlan
from cocodet.modes.wiring import build_datamodule
from cocodet.run_spec.records import RunSpec


def preview(spec: RunSpec, plan: LoaderPlan, resources) -> dict:
    from cocodet.preview import render_previews

    datamodule = build_datamodule(spec, plan)
    settings = spec.settings("preview")
    try:
        paths, batch_bins = render_previews(datamodule, spec.run_dir / "previews", batches=int(settings["batches"]),
                                            epoch=int(settings["epoch"]))
    finally:
        datamodule.teardown("preview")  # a remote root's read-ahead thread
    return {"mode": "preview", "pngs": [str(p) for p in paths], "batch_bins": batch_bins, **plan.summary()}
