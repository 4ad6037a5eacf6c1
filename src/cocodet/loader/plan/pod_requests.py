"""What a Kubernetes pod of this run asks for, per node, from the loader plan (``mode=plan``
prints it; ``deploy/k8s/`` sizes its pods by it): the CPUs its processes use and the size of the
memory-backed ``emptyDir`` mounted on /dev/shm.

- CPUs: each local rank's main process plus its train workers (the val loader's workers take
  turns with them: validation runs between training steps).
- /dev/shm: the plan lets a rank use half of the free /dev/shm split between local ranks
  (``loader/plan/budget.py``), so the volume is twice what the ranks' loaders hold in flight (train and
  val), rounded up to 64 MiB. A pod given less plans fewer workers, and says so.
"""

from __future__ import annotations

from cocodet.loader.plan.shm_rule import shm_size_for_share

SHM_STEP = 64 << 20  # emptyDir sizes in whole 64 MiB


def pod_requests(plan) -> dict:
    """``{"cpu": int, "shm_size_limit": "NMi", "local_ranks": int}`` for a pod of ``plan.local_ranks`` ranks."""
    ranks = max(1, plan.local_ranks)
    split = plan.shm_split or {}
    in_flight = int(split.get("train", plan.inflight_bytes)) + int(split.get("val", 0))
    shm = shm_size_for_share(in_flight, ranks, SHM_STEP)
    return {"cpu": ranks * (plan.num_workers + 1), "shm_size_limit": f"{shm >> 20}Mi", "local_ranks": ranks}


def pod_requests_text(plan) -> str:
    pod = pod_requests(plan)
    return (
        f"cpu: {pod['cpu']}, /dev/shm emptyDir sizeLimit: {pod['shm_size_limit']} ({pod['local_ranks']} rank(s) x "
        f"({plan.num_workers} workers + 1); 2 x what they hold in flight)"
    )
