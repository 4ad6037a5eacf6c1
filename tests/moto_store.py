"""A real S3 server for tests: moto_server on 127.0.0.1 at a free port, filled from a folder,
stopped by whoever started it. Server mode, not moto's in-process mocks: those do not cover
aiobotocore, which s3fs uses."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

DUMMY_KEYS = {
    "AWS_ACCESS_KEY_ID": "testing-key-id",
    "AWS_SECRET_ACCESS_KEY": "testing-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moto_server_binary() -> str:
    found = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if found is None:
        import pytest

        pytest.skip("moto_server is not installed (requirements-test.txt)")
    return found


@contextmanager
def moto_server(auth_after: int | None = None):
    """Yield the endpoint URL of a fresh moto_server; stop it on exit. ``auth_after``: moto
    accepts any key until this many requests were made, then checks keys and policies
    (``INITIAL_NO_AUTH_ACTION_COUNT``)."""
    port = free_port()
    env = {**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": str(auth_after)} if auth_after is not None else {})}
    workdir = tempfile.mkdtemp(prefix="moto-")  # its request recording (MOTO_ENABLE_RECORDING) goes there
    proc = subprocess.Popen(
        [moto_server_binary(), "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on port {port}") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        end_process(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def end_process(proc: subprocess.Popen, graceful_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``graceful_s`` (0: SIGKILL at once, a crash); reaped either way."""
    if graceful_s > 0:
        proc.terminate()
        try:
            proc.wait(timeout=graceful_s)
            return
        except subprocess.TimeoutExpired:
            pass
    proc.kill()
    proc.wait()


def s3_client(endpoint: str, **keys):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=keys.get("key", DUMMY_KEYS["AWS_ACCESS_KEY_ID"]),
        aws_secret_access_key=keys.get("secret", DUMMY_KEYS["AWS_SECRET_ACCESS_KEY"]),
    )


def upload_folder(endpoint: str, folder: Path, bucket: str, prefix: str = "", **keys) -> int:
    """Create ``bucket`` and put every file under ``folder`` at ``prefix/<relative path>``;
    return the number of objects."""
    client = s3_client(endpoint, **keys)
    client.create_bucket(Bucket=bucket)
    count = 0
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            key = "/".join(p for p in (prefix.strip("/"), path.relative_to(folder).as_posix()) if p)
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
            count += 1
    return count


@contextmanager
def filled_store(folder: Path, bucket: str):
    """Yield (endpoint, objects uploaded) of a moto_server holding ``folder`` in ``bucket``, with
    dummy keys in the environment (moto accepts any key) and request recording on; the
    environment is restored after."""
    saved = {k: os.environ.get(k) for k in (*DUMMY_KEYS, "MOTO_ENABLE_RECORDING")}
    os.environ.update(DUMMY_KEYS, MOTO_ENABLE_RECORDING="True")
    try:
        with moto_server() as endpoint:
            yield endpoint, upload_folder(endpoint, folder, bucket)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def recorded(endpoint: str, reset: bool = False) -> list[dict]:
    """The requests moto_server recorded (and with ``reset``, forget them first)."""
    if reset:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/recorder/reset-recording", method="POST"))
        return []
    text = urllib.request.urlopen(f"{endpoint}/moto-api/recorder/download-recording").read().decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
