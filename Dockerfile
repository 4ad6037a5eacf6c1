# cocodet training image. Torch wheels from PyPI carry their CUDA runtime; the host needs
# only the NVIDIA driver + container toolkit. Run with --shm-size (or --ipc=host): see README.
FROM python:3.11.7-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first (exact pins from requirements.txt), so code edits reuse this layer.
COPY requirements.txt ./
RUN pip install -r requirements.txt

COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-deps --no-build-isolation .

COPY train.py ./
COPY conf ./conf
COPY scripts ./scripts

RUN useradd --create-home --uid 1000 cocodet && mkdir -p /app/data /app/outputs && chown -R cocodet /app
USER 1000

ENTRYPOINT ["python", "train.py"]
