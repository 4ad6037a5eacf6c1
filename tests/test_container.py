"""What a container or a rescheduled pod relies on: ckpt_path=last_if_any, and the plan the
Kubernetes Job's environment produces. (scripts/container_check.sh builds and runs the image.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import NARROW_MODEL, REPO, run_in_process, synthetic_overrides

JOB = REPO / "deploy" / "k8s" / "job.yaml"


def tiny(root) -> list[str]:
    return [
        *synthetic_overrides(root),
        "dataset.image_size=64",
        "loader.batch_size=16",
        NARROW_MODEL,
        "trainer.limit_train_batches=1",
        "trainer.limit_val_batches=1",
        "logger=none",
    ]


def test_last_if_any_starts_fresh_then_resumes_and_never_takes_another_run(tmp_path, synthetic_root, caplog):
    caplog.set_level("INFO")
    volume = tmp_path / "runs"
    other = run_in_process([*tiny(synthetic_root), "trainer.max_epochs=2"], volume / "someone-else")
    assert other["steps"] == 2 and other["last_ckpt"]  # a volume that already holds another run's checkpoints
    mine = volume / "my-run"
    first = run_in_process([*tiny(synthetic_root), "trainer.max_epochs=1", "ckpt_path=last_if_any"], mine)
    assert first["steps"] == 1 and "no checkpoint in" in caplog.text  # fresh: not someone-else's steps
    caplog.clear()
    second = run_in_process([*tiny(synthetic_root), "trainer.max_epochs=2", "ckpt_path=last_if_any"], mine)
    assert second["steps"] == 2 and f"resuming {mine}" in caplog.text  # continued from step 1


def _job_container() -> dict:
    job = yaml.safe_load(JOB.read_text())
    [container] = job["spec"]["template"]["spec"]["containers"]
    return job, container


def test_the_job_manifest_holds_what_an_eviction_needs():
    job, container = _job_container()
    pod = job["spec"]["template"]["spec"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"]
    assert {"mountPath": "/dev/shm", "name": "dshm"} in container["volumeMounts"]
    env = {e["name"]: e for e in container["env"]}
    assert env["COCODET_NUM_WORKERS"]["valueFrom"]["resourceFieldRef"]["resource"] == "limits.cpu"
    assert pod["securityContext"]["fsGroup"] and pod["terminationGracePeriodSeconds"] >= 120
    assert "ckpt_path=last_if_any" in container["args"] and "loader=inherited" in container["args"]
    assert any(a.startswith("hydra.run.dir=/runs/") for a in container["args"])


def test_the_job_environment_gives_an_inherited_capped_plan(tmp_path, coco_tiny, monkeypatch):
    """mode=plan with the manifest's own arguments and environment: the CPU limit (8) arrives
    through the downward API as COCODET_NUM_WORKERS and is a ceiling, capped by this host."""
    _, container = _job_container()
    limit = int(container["resources"]["limits"]["cpu"])
    monkeypatch.setenv("COCODET_NUM_WORKERS", str(limit))  # what resourceFieldRef limits.cpu / divisor 1 gives
    monkeypatch.setenv("COCODET_CACHE_DIR", str(tmp_path / "cache"))
    args = [a for a in container["args"] if not a.startswith(("dataset.root=", "hydra.run.dir=", "trainer="))]
    s = run_in_process([*args, f"dataset.root={coco_tiny}", "mode=plan"], tmp_path / "plan")
    assert s["source"] == "inherited" and s["requested"] == limit
    cpu = next(c for c in s["caps"] if c["name"] == "cpu")
    assert s["num_workers"] <= s["usable_cpus"] and (cpu["applied"] or s["usable_cpus"] >= limit)


def kubernetes_validate(path) -> subprocess.CompletedProcess:
    exe = shutil.which("kubernetes-validate") or str(Path(sys.executable).parent / "kubernetes-validate")
    # --strict: a field the schema does not know (a typo, a field at the wrong level) fails too.
    return subprocess.run([exe, "--strict", str(path)], capture_output=True, text=True, timeout=120)


# Kubernetes' own kinds (JobSet's fields: tests/test_k8s_multinode.py, against its API's schema)
@pytest.mark.parametrize(
    "manifest", sorted(p.name for p in (REPO / "deploy" / "k8s").glob("*.yaml") if "kind: JobSet" not in p.read_text())
)
def test_kubernetes_manifests_validate_offline(manifest):
    proc = kubernetes_validate(REPO / "deploy" / "k8s" / manifest)
    assert proc.returncode == 0 and "passed" in proc.stdout, proc.stdout + proc.stderr


def test_the_validator_refuses_a_misplaced_field(tmp_path):
    job = yaml.safe_load(JOB.read_text())
    job["spec"]["template"]["spec"]["containers"][0]["resource"] = {"limits": {"memory": "1Gi"}}  # not "resources"
    bad = tmp_path / "job.yaml"
    bad.write_text(yaml.safe_dump(job))
    proc = kubernetes_validate(bad)
    assert proc.returncode != 0 and "resource" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
