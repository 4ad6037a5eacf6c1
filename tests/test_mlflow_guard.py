"""logger=mlflow's pieces that need no server (issue #59): a tracker that is down costs one
bounded attempt, then none; what a run records leaves credentials out; MLflow credentials are
refused as overrides and in config files, as a bucket's are."""

from __future__ import annotations

import logging
import os
import time

import pytest
from conftest import REPO, run_in_process, run_train
from hydra import compose, initialize_config_dir
from moto_store import free_port


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=["logger=mlflow", "output_dir=/tmp/cocodet-mlflow", *overrides])


def test_a_tracker_that_is_down_costs_one_bounded_attempt_then_none(tmp_path, caplog, monkeypatch):
    from cocodet.tracking.guard import GuardedClient, bound_requests
    from cocodet.tracking.tracked_run import TrackedRun

    for name in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    bound_requests(5, 1)
    guard = GuardedClient(f"http://127.0.0.1:{free_port()}", tmp_path / "mlflow_unsent.jsonl")  # nothing listens
    run = TrackedRun(guard, "cocodet")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        run.start("r", params={"a": "1"}, tags={"t": "x"})
        first = time.monotonic() - started
        for step in range(50):
            run.log_metrics({"train/loss": 1.0}, step)
        run.end("completed")
    assert first < 10  # MLflow's defaults: 7 retries with back-off
    assert time.monotonic() - started - first < 1  # no attempt after the first failure
    assert len([r for r in caplog.records if "MLflow:" in r.getMessage()]) == 1
    assert guard.unsent == 1 + 1 + 50 + 1  # the failed call, create_run (with the params), 50 steps, the end
    assert len((tmp_path / "mlflow_unsent.jsonl").read_text().splitlines()) == guard.unsent


def test_the_closing_calls_end_within_their_budget_when_the_server_stops_answering(tmp_path, monkeypatch):
    """A server that accepts connections and never answers (a hung process): the last calls of a
    run, in ``closing(2)``, end in about 2 s, not 5 s per request (or MLflow's 120 s x 8)."""
    import socket

    import mlflow.entities  # noqa: F401  imported before the clock starts, as in a run that is ending
    import mlflow.tracking  # noqa: F401

    from cocodet.tracking.guard import GuardedClient
    from cocodet.tracking.tracked_run import TrackedRun

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes connections; nothing ever reads or answers
        guard = GuardedClient(f"http://127.0.0.1:{silent.getsockname()[1]}", tmp_path / "unsent.jsonl")
        run = TrackedRun(guard, "cocodet")
        run.run_id = "0" * 32
        started = time.monotonic()
        with guard.closing(2, "logger.mlflow.close_within_s"):
            run.set_tags({"cocodet.status": "preempted"})
            run.log_text("plan", "loader_plan.txt")
            run.end("preempted")
        seconds = time.monotonic() - started
    assert seconds < 3.5 and guard.unsent == 3 and "Timeout" in guard.failure
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "5" and os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1"


def test_requests_are_bounded_unless_the_user_set_the_variables(monkeypatch):
    from cocodet.tracking.guard import bound_requests

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "4")
    bound_requests(5, 1)
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "5" and os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "4"


def test_a_missing_run_id_is_an_answer_not_an_outage(tmp_path, caplog):
    from cocodet.tracking.guard import GuardedClient
    from cocodet.tracking.tracked_run import TrackedRun

    guard = GuardedClient(f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "unsent.jsonl")
    run = TrackedRun(guard, "cocodet", (tmp_path / "mlartifacts").as_uri())
    with caplog.at_level(logging.WARNING):
        run.start("r", params={}, tags={}, resume_id="0123456789abcdef0123456789abcdef")
    assert guard.alive and run.run_id not in (None, "0123456789abcdef0123456789abcdef") and not run.resumed
    assert "not in" in caplog.text  # "run ... named in the checkpoint is not in <store>; starting a new run"


def test_the_default_store_is_the_checkouts_sqlite_file(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("COCODET_MLFLOW_DB", raising=False)
    assert compose_config().logger.mlflow.tracking_uri == f"sqlite:///{REPO}/mlflow.db"
    monkeypatch.setenv("COCODET_MLFLOW_DB", "/runs/mlflow.db")
    assert compose_config().logger.mlflow.tracking_uri == "sqlite:////runs/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert compose_config().logger.mlflow.tracking_uri == "http://mlflow.internal:5000"


def test_parameters_are_the_resolved_config_without_credentials(monkeypatch):
    from cocodet.tracking.run_record import flat_params

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://bob:Hidden-4d2e@mlflow.internal:5000")
    params = flat_params(compose_config("+dataset.storage_options.secret=Hidden-91aa", "loader.batch_size=3"))
    assert params["loader.batch_size"] == "3" and params["augment.hsv"] == "[10, 40, 30]"
    assert params["logger.mlflow.tracking_uri"] == "http://***@mlflow.internal:5000"
    assert "dataset.storage_options.secret" not in params and "Hidden" not in str(params)


def test_every_summary_status_ends_the_mlflow_run_as_documented():
    from cocodet.errors import RUN_STATUSES
    from cocodet.tracking.run_record import MLFLOW_STATUS

    assert set(MLFLOW_STATUS) == set(RUN_STATUSES)
    assert {s for s, m in MLFLOW_STATUS.items() if m == "KILLED"} == {"preempted", "interrupted", "store_down"}
    assert {s for s, m in MLFLOW_STATUS.items() if m == "FAILED"} == {"diverged", "collapsed", "disk_full", "nonfinite"}


@pytest.mark.parametrize(
    "override",
    [
        "hydra.job.env_set.MLFLOW_TRACKING_PASSWORD={s}",
        "+hydra.job.env_set.MLFLOW_TRACKING_TOKEN={s}",
        "+logger.mlflow.password={s}",
        "logger.mlflow.tracking_uri=http://bob:{s}@mlflow.internal:5000",
    ],
)
def test_an_mlflow_credential_override_is_refused_in_one_line(override, tmp_path):
    secret = "cocodet-MLFLOW-secret-5b7a"
    proc, _ = run_train(["logger=mlflow", "mode=plan", override.format(s=secret)], tmp_path / "run", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "MLFLOW_TRACKING_PASSWORD" in lines[0], proc.stderr
    assert secret not in proc.stderr + proc.stdout and not (tmp_path / "run").exists()


def test_an_mlflow_credential_in_a_config_file_is_refused(tmp_path):
    from cocodet.errors import ConfigError

    with pytest.raises(ConfigError, match="logger.mlflow.tracking_uri: a credential"):
        run_in_process(["mode=plan", "logger=mlflow", "logger.mlflow.tracking_uri=http://u:p@h:5000"], tmp_path / "r")


FIRST_CONTACT = """
import sys, time
from cocodet.tracking.guard import GuardedClient
from cocodet.tracking.tracked_run import TrackedRun
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # all at once
run = TrackedRun(GuardedClient(sys.argv[1], sys.argv[3]), "cocodet")
run.start(sys.argv[4], params={}, tags={})
print(run.run_id if run.guard.alive else "FAILED " + str(run.guard.failure))
"""


def test_runs_started_together_on_a_fresh_sqlite_store_all_reach_it(tmp_path):
    """MLflow's first client on a new SQLite file runs all its migrations; two doing that at
    once (two runs started together, before a sweep's parent existed) broke alembic's version
    row and one run lost MLflow. cocodet makes them take turns."""
    import subprocess
    import sys

    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    start_at = time.time() + 4  # after every interpreter has imported mlflow
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_CONTACT, uri, str(start_at), str(tmp_path / f"unsent{i}"), f"run{i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    answers = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert not [a for a in answers if not a or a.startswith("FAILED")], answers
    assert len(set(answers)) == 4


def test_a_guarded_client_travels_to_a_sweeps_jobs(tmp_path):
    """Hydra's joblib and submitit launchers pickle their callbacks, the sweep parent's client
    among them: its threads, locks and queue stay behind, a copy starts with its own."""
    import pickle

    from cocodet.tracking.guard import GuardedClient

    guard = GuardedClient(f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "unsent.jsonl")
    copy = pickle.loads(pickle.dumps(guard))
    assert copy.tracking_uri == guard.tracking_uri and copy.alive and copy.unsent == 0
    assert copy._lock is not guard._lock


class _SignalledLock:
    """A lock that says when another thread has begun waiting for it."""

    def __init__(self):
        import threading

        self._lock, self.waited = threading.Lock(), threading.Event()

    def acquire(self, *args, **kwargs):
        self.waited.set()
        return self._lock.acquire(*args, **kwargs)

    def release(self):
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


def test_an_outage_ends_in_one_line_when_the_retry_and_the_close_both_empty_the_queue(tmp_path, caplog, monkeypatch):
    """The background retry and the run's closing calls may both find the queue empty at the
    end of one outage: the log says once that the server is back, as many times as `outages`."""
    import threading

    from cocodet.tracking import retry_queue
    from cocodet.tracking.guard import GuardedClient

    monkeypatch.setattr(retry_queue, "RETRY_FIRST_S", 3600.0)  # the test plays the retry's part itself

    class Flaky:
        down = True

        def log_batch(self, run_id, metrics):
            if self.down:
                raise ConnectionError("refused")

    guard = GuardedClient("http://127.0.0.1:1", tmp_path / "mlflow_unsent.jsonl")
    guard._client, guard._sending = Flaky(), _SignalledLock()
    with caplog.at_level(logging.WARNING):
        for step in range(3):
            guard.call("log_batch", "run-1", [step], keep={"run_id": "run-1", "step": step})
        guard._client.down = False
        guard._sending.acquire()  # the retry is sending the queue when the run's close begins
        guard._sending.waited.clear()
        with guard.closing(30, "logger.mlflow.close_end_within_s"):
            closer = threading.Thread(target=guard._flush)  # what closing() does at its end
            closer.start()
            assert guard._sending.waited.wait(10)  # the close waits for the retry's send
            assert guard._drain()
            guard._sending.release()
            guard._back()  # what the retry does once its send emptied the queue
            closer.join(30)
    guard.finish()
    backs = [r.getMessage() for r in caplog.records if "answers again after" in r.getMessage()]
    assert guard.outages == 1 and guard.unsent == 0 and len(backs) == 1, backs


def test_the_last_line_of_a_run_with_unsent_calls_says_what_the_run_reads_and_how_to_send_them(tmp_path):
    from cocodet.tracking.unsent import unsent_line

    folder = tmp_path / "run 1"  # a space: the command is quoted for a shell
    block = {"unsent": 3, "tracking_uri": "http://127.0.0.1:5000", "unsent_file": str(folder / "mlflow_unsent.jsonl")}
    assert unsent_line(None) is None and unsent_line({**block, "unsent": 0}) is None
    running = unsent_line({**block, "run_id": "abc", "ended": False})
    assert running.startswith("MLflow: 3 calls were not sent to http://127.0.0.1:5000 (listed in ")
    assert "run abc is still RUNNING there" in running
    assert running.endswith(f"send them with: python -m cocodet.tracking replay '{folder}'")
    assert "run abc ended there without them" in unsent_line({**block, "run_id": "abc", "ended": True})
    assert "the run was never created there (the replay creates it)" in unsent_line({**block, "run_id": None})
