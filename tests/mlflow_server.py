"""A real MLflow tracking server for tests: ``mlflow server`` on 127.0.0.1 at a free port, its
runs in a SQLite database and its artifacts in a folder, both under a given directory; polled
until it answers, stopped (its whole process group: uvicorn and the job runner) by whoever
started it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from moto_store import free_port


class MlflowServer:
    def __init__(self, folder: Path, port: int | None = None):
        self.folder, self.port = Path(folder), port or free_port()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "MlflowServer":
        binary = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or "mlflow"
        cmd = [
            binary,
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.folder / 'mlflow.db'}",
            "--artifacts-destination",
            str(self.folder / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        log = (self.folder / "server.log").open("ab")
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.folder,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
        )
        self.wait_until_it_answers()
        return self

    def wait_until_it_answers(self, within_s: float = 90) -> None:
        """Poll /health (a started server takes 5-10 s); stop it and raise if it never answers."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                if urllib.request.urlopen(f"{self.uri}/health", timeout=2).status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = self.folder / "server.log"
                raise RuntimeError(
                    f"mlflow did not answer on {self.uri}: {log.read_text()[-2000:] if log.exists() else ''}"
                )
            time.sleep(0.2)

    def stop(self, graceful: bool = True) -> None:
        """SIGTERM (``graceful``) or SIGKILL to the whole group, then reap."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM if graceful else signal.SIGKILL)
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            self.proc.wait()
        self.proc = None

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)
