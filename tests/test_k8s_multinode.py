"""The multi-node manifests (deploy/k8s/jobset.yaml, indexed-job.yaml): valid offline, run the
torchrun command tests/test_ddp.py runs on two agents, and are sized by mode=plan."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import REPO, run_in_process
from test_container import kubernetes_validate
from test_ddp import TORCHRUN_FLAGS, node_overrides

K8S = REPO / "deploy" / "k8s"
JOBSET_SCHEMA = json.loads((Path(__file__).parent / "schemas" / "jobset-v1alpha2.json").read_text())


def documents(name: str) -> dict:
    return {d["kind"]: d for d in yaml.safe_load_all((K8S / name).read_text())}


def jobset() -> dict:
    return documents("jobset.yaml")["JobSet"]


def job_specs() -> dict[str, dict]:
    """{manifest: its Job's spec}: the JobSet's one replicated Job, and the Indexed Job."""
    return {
        "jobset.yaml": jobset()["spec"]["replicatedJobs"][0]["template"]["spec"],
        "indexed-job.yaml": documents("indexed-job.yaml")["Job"]["spec"],
    }


def container(spec: dict) -> dict:
    [c] = spec["template"]["spec"]["containers"]
    return c


def flags(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args if a.startswith("--"))


def overrides(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args[args.index("/app/train.py") + 1 :])


def test_the_jobsets_own_fields_follow_the_jobset_api():
    jsonschema.validate(jobset(), JOBSET_SCHEMA)
    typo = copy.deepcopy(jobset())
    typo["spec"]["failurePolicy"]["maxRestart"] = typo["spec"]["failurePolicy"].pop("maxRestarts")
    with pytest.raises(jsonschema.ValidationError, match="maxRestart"):
        jsonschema.validate(typo, JOBSET_SCHEMA)


def test_the_jobsets_job_template_validates_as_a_kubernetes_job(tmp_path):
    template = jobset()["spec"]["replicatedJobs"][0]["template"]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "cocodet-multinode-node-0"},
        "spec": template["spec"],
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = kubernetes_validate(tmp_path / "job.yaml")
    assert proc.returncode == 0 and "passed" in proc.stdout, proc.stdout + proc.stderr


def torchrun_command_tested() -> tuple[dict[str, str], dict[str, str]]:
    """The torchrun flags and train.py overrides of test_ddp's two-agent runs (the endpoint and id: placeholders)."""
    tested = [
        *TORCHRUN_FLAGS,
        "--rdzv-endpoint=HOST:PORT",
        "--rdzv-id=ID",
        "/app/train.py",
        *node_overrides(Path("/data")),
    ]
    return flags(tested), overrides(tested)


@pytest.mark.parametrize("manifest", ["jobset.yaml", "indexed-job.yaml"])
def test_the_manifests_run_the_torchrun_command_the_tests_run(manifest):
    spec = job_specs()[manifest]
    c = container(spec)
    theirs, ours = flags(c["args"]), torchrun_command_tested()[0]
    assert theirs.keys() == ours.keys() and theirs["--rdzv-backend"] == ours["--rdzv-backend"] == "c10d"
    assert int(theirs["--max-restarts"]) >= int(ours["--max-restarts"]) >= 1
    nodes, per_node = int(theirs["--nnodes"]), int(theirs["--nproc-per-node"])
    assert nodes == spec["completions"] == spec["parallelism"] == int(ours["--nnodes"])
    args, tested = overrides(c["args"]), torchrun_command_tested()[1]
    trainer_keys = {k for k in tested if k.startswith("trainer.")} - {
        "trainer.max_epochs",
        "trainer.enable_progress_bar",
    }
    assert trainer_keys <= args.keys() and int(args["trainer.num_nodes"]) == nodes
    assert int(args["trainer.devices"]) == per_node == int(c["resources"]["limits"]["nvidia.com/gpu"])
    assert (args["trainer"], tested["trainer"]) == ("ddp", "ddp_cpu")  # the GPU group and its CPU twin
    assert "ckpt_path" not in args and "ckpt_path" not in tested  # under torchrun none means last_if_any
    assert c["command"][-1].endswith("/torchrun") and "/app/train.py" in c["args"]
    # Pod 0's stable name: JobSet's <jobset>-<replicatedJob>-0-0.<subdomain>, the Job's <job>-0.<service>
    pod0 = (
        "cocodet-multinode-node-0-0.cocodet-multinode"
        if manifest == "jobset.yaml"
        else "cocodet-multinode-0." + spec["template"]["spec"]["subdomain"]
    )
    host, port = theirs["--rdzv-endpoint"].rsplit(":", 1)
    assert host == pod0 and {"containerPort": int(port), "name": "rendezvous"} in c["ports"]


def test_the_two_manifests_run_the_same_pod_but_for_the_rendezvous_name():
    pods = {}
    for name, spec in job_specs().items():
        pod = copy.deepcopy(spec["template"]["spec"])
        pod.pop("subdomain", None)
        args = container({"template": {"spec": pod}})["args"]
        args[:] = [re.sub(r"^--rdzv-endpoint=.*", "--rdzv-endpoint=POD0", a) for a in args]
        pods[name] = pod
    assert pods["jobset.yaml"] == pods["indexed-job.yaml"]


@pytest.mark.parametrize("manifest", ["jobset.yaml", "indexed-job.yaml"])
def test_the_pods_hold_what_a_lost_node_needs(manifest):
    spec = job_specs()[manifest]
    pod, c = spec["template"]["spec"], container(spec)
    env = {e["name"]: e.get("value") or e.get("valueFrom") for e in c["env"]}
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # a recreated pod's agent can join (elastic/meeting.py)
    assert env["COCODET_NUM_WORKERS"]["resourceFieldRef"]["resource"] == "limits.cpu"  # the downward API
    assert {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG"} <= env.keys()
    runs = next(v for v in pod["volumes"] if v["name"] == "runs")
    mount = next(m for m in c["volumeMounts"] if m["name"] == "runs")
    assert overrides(c["args"])["hydra.run.dir"].startswith(mount["mountPath"] + "/") and runs["persistentVolumeClaim"]
    assert {"type": "DisruptionTarget"} in spec["podFailurePolicy"]["rules"][0]["onPodConditions"]
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] >= 120


@pytest.mark.parametrize("manifest", ["jobset.yaml", "indexed-job.yaml"])
def test_the_pods_are_sized_by_mode_plan(manifest, coco_tiny, tmp_path):
    """mode=plan with the pod's own arguments (8 local ranks, 8 workers each, on a CPU) prints the
    CPUs and /dev/shm a pod asks for: the manifest asks for at least that."""
    spec = job_specs()[manifest]
    c = container(spec)
    args = {
        **overrides(c["args"]),
        "dataset.root": str(coco_tiny),
        "trainer.accelerator": "cpu",
        "loader": "explicit",
        "loader.num_workers": "8",
    }
    args.pop("hydra.run.dir")
    s = run_in_process([f"{k}={v}" for k, v in args.items()] + ["mode=plan"], tmp_path / "plan")
    assert s["pod"]["local_ranks"] == int(args["trainer.devices"])
    shm = next(v for v in spec["template"]["spec"]["volumes"] if v["name"] == "dshm")["emptyDir"]
    assert shm["medium"] == "Memory" and int(shm["sizeLimit"].removesuffix("Mi")) >= int(
        s["pod"]["shm_size_limit"].removesuffix("Mi")
    )
    assert int(c["resources"]["requests"]["cpu"]) >= s["pod"]["cpu"]


def bucket_jobset() -> dict:
    return documents("jobset-bucket.yaml")["JobSet"]


def test_the_bucket_jobset_validates_and_needs_no_shared_volume(tmp_path):
    jsonschema.validate(bucket_jobset(), JOBSET_SCHEMA)
    template = bucket_jobset()["spec"]["replicatedJobs"][0]["template"]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "cocodet-multinode-node-0"}, **template}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = kubernetes_validate(tmp_path / "job.yaml")
    assert proc.returncode == 0 and "passed" in proc.stdout, proc.stdout + proc.stderr
    pod = template["spec"]["template"]["spec"]
    assert all("persistentVolumeClaim" not in v for v in pod["volumes"]), pod["volumes"]
    args = overrides(container(template["spec"])["args"])
    assert args["checkpoint.dir"].startswith("s3://") and args["dataset.root"].startswith("s3://")
    env = {e["name"]: e.get("valueFrom", {}) for e in container(template["spec"])["env"]}
    assert all("secretKeyRef" in env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"))


def test_the_bucket_jobset_is_the_jobset_but_for_where_data_and_checkpoints_live():
    """Everything else (torchrun flags, restarts, sizes, environment) as jobset.yaml's, which the
    tests above hold to the tested command."""
    ours, theirs = bucket_jobset(), jobset()
    pod_ours = ours["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod_theirs = theirs["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    c_ours, c_theirs = pod_ours["containers"][0], pod_theirs["containers"][0]
    moved = {"dataset.root", "checkpoint.dir"}
    assert {k: v for k, v in overrides(c_ours["args"]).items() if k not in moved} == {
        k: v for k, v in overrides(c_theirs["args"]).items() if k not in moved
    }
    assert flags(c_ours["args"]) == flags(c_theirs["args"]) and c_ours["resources"] == c_theirs["resources"]
    assert [e for e in c_ours["env"] if not e["name"].startswith("AWS_")] == c_theirs["env"]
    assert ours["spec"]["failurePolicy"] == theirs["spec"]["failurePolicy"]
    assert [m for m in c_ours["volumeMounts"]] == [m for m in c_theirs["volumeMounts"] if m["name"] != "coco"]
