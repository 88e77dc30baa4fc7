# syntax=docker/dockerfile:1
# mazerl-train: the GPU image of the SkyRL cluster run. KubeRay starts Ray in it (head and
# workers) and the Ray job's entrypoint runs maze-train inside the head pod, so `ray` and the
# workspace's console scripts are both on PATH.
#
# Build context: the repository root.
#   docker build -f infra/images/train.Dockerfile -t mazerl-train .
#
# The workspace comes from uv.lock (--frozen). SkyRL's `fsdp` extra is layered on top because
# the lock cannot hold it: flash-attn and causal-conv1d are source-only CUDA builds, flashinfer's
# kernels live on flashinfer's own index, and vLLM 0.30 needs torch 2.13.0 where the lock
# (resolved for the CPU test suite) has 2.15.0. That layer moves torch (and its CUDA libraries)
# to 2.13.0 and setuptools below 81 (vLLM's bound), inside the workspace's own ranges; its other
# packages that the lock holds keep their locked versions (skyrl-fsdp-overrides.txt).

# CUDA 13.0 toolkit: PyPI's torch 2.13.0 wheels are CUDA 13.0 builds, and the extensions built
# below must be compiled by the same CUDA major version. Ubuntu 24.04 ships Python 3.12.
FROM nvidia/cuda:13.0.2-devel-ubuntu24.04

ARG SKYRL_VERSION=0.4.0
# Parallel nvcc jobs for flash-attn / causal-conv1d (each takes several GB of RAM).
ARG MAX_JOBS=8
# sm_80 kernels also run on sm_86/sm_89 (A10G, L40S); sm_90 H100/H200; sm_120 RTX PRO 6000.
ARG FLASH_ATTN_CUDA_ARCHS="80;90;120"

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    MAX_JOBS=${MAX_JOBS} \
    FLASH_ATTN_CUDA_ARCHS=${FLASH_ATTN_CUDA_ARCHS}

# The distribution's Python 3.12 (what .python-version pins) rather than a uv-managed download:
# it comes with the headers the CUDA extensions compile against, from the same apt layer.
# wget: KubeRay's default readiness/liveness probes call it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3.12 python3.12-dev python3.12-venv \
        build-essential ninja-build git ca-certificates wget \
    && rm -rf /var/lib/apt/lists/*

COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /uvx /usr/local/bin/

ENV UV_PYTHON=python3.12 \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/opt/venv \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

WORKDIR /src
COPY pyproject.toml uv.lock .python-version ./
COPY packages/ packages/
COPY apps/ apps/
# maze-trainer and what it needs (maze-engine, ray[default], skyrl, torch ...), as locked.
RUN uv sync --frozen --no-dev --no-editable --package maze-trainer

# SkyRL's FSDP backend (vLLM 0.30, flash-attn, flashinfer) into the same venv. torch and the
# build tools go first: flash-attn and causal-conv1d build against the installed torch.
COPY infra/images/skyrl-fsdp-overrides.txt /tmp/skyrl-fsdp-overrides.txt
RUN uv pip install --python /opt/venv/bin/python \
        torch==2.13.0 torchvision==0.28.0 \
        setuptools==80.9.0 wheel==0.45.1 ninja==1.13.0 packaging==26.4 psutil==7.2.2 \
    && uv pip install --python /opt/venv/bin/python \
        --extra-index-url https://flashinfer.ai/whl/cu130 \
        --extra-index-url https://flashinfer.ai/whl \
        --no-build-isolation-package flash-attn \
        --no-build-isolation-package causal-conv1d \
        --override /tmp/skyrl-fsdp-overrides.txt \
        "skyrl[fsdp]==${SKYRL_VERSION}" \
    && uv pip freeze --python /opt/venv/bin/python > /opt/venv/image-freeze.txt \
    && maze-train --help > /dev/null \
    && ray --version

WORKDIR /workspace
# No ENTRYPOINT: KubeRay replaces the command with `ray start ...`, and `docker run mazerl-train`
# alone runs the tiny local job.
CMD ["maze-train"]
