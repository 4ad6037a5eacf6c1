# cocodet training image. Torch wheels from PyPI carry their CUDA runtime; the host needs
# only the NVIDIA driver + container toolkit. Run with --shm-size (or --ipc=host): see README.
#
# Any Debian-based image with python3 and its venv module works as the base (the official
# python image, or Debian's own python3 + python3-venv); everything installs into a venv at
# /opt/venv, so the entry point is the same whatever the base calls its python.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# Settings for any --user UID:GID, with or without a passwd entry or a home: every cache a
# run writes goes to a place that user can write (the cocodet index cache to /cache, a
# volume in production; the rest under /tmp).
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/matplotlib \
    TORCH_HOME=/tmp/torch \
    COCODET_CACHE_DIR=/cache \
    COCODET_MLFLOW_DB=/app/outputs/mlflow.db \
    MLFLOW_DISABLE_TELEMETRY=true

WORKDIR /app

# Dependencies first (exact pins from requirements.txt), so code edits reuse these layers.
# dumb-init is PID 1: it forwards SIGTERM to python alone (--single-child, so DataLoader
# workers are not killed under the main process) and reaps orphaned processes.
COPY requirements.txt ./
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install -r requirements.txt dumb-init==1.2.5.post1

COPY pyproject.toml README.md ./
COPY src ./src
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation . && rm -rf build src/*.egg-info

COPY train.py ./
COPY conf ./conf
COPY scripts ./scripts

# Folders a run writes, world-writable with the sticky bit (as /tmp), so an arbitrary UID can
# run the synthetic default and keep its outputs; mount volumes over them to keep results.
# logger=mlflow without a server writes to /app/outputs/mlflow.db (COCODET_MLFLOW_DB above), in
# that volume too.
RUN useradd --create-home --uid 1000 cocodet \
    && mkdir -p /app/data /app/outputs /cache \
    && chmod 1777 /app/data /app/outputs /cache
USER 1000

STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/venv/bin/dumb-init", "--single-child", "--", "/opt/venv/bin/python", "/app/train.py"]
