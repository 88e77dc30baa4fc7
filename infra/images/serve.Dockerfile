# syntax=docker/dockerfile:1
# mazerl-serve: maze-serve as a SageMaker real-time endpoint container. SageMaker starts it as
# `docker run <image> serve` and talks to /ping and /invocations on port 8080.
#
# Build context: the repository root.
#   docker build -f infra/images/serve.Dockerfile -t mazerl-serve .
#
# Only the serving app and its packages are installed (no SkyRL, no Ray), from uv.lock. torch is
# the lock's PyPI wheel, a CUDA 13 build that carries its CUDA libraries: the same image runs on
# CPU and GPU instances (GPU ones need the NVIDIA 580 driver: `maze-infra endpoint deploy` picks
# SageMaker's al2023 GPU AMI for them). A CPU-only torch would save ~4 GB but cannot come from
# this lock.

FROM python:3.12-slim-bookworm AS build
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /usr/local/bin/uv
ENV UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/opt/venv
WORKDIR /src
COPY pyproject.toml uv.lock .python-version ./
COPY packages/ packages/
COPY apps/ apps/
RUN uv sync --frozen --no-dev --no-editable --package maze-server

# Same base as the build stage, so the venv's interpreter path is the same.
FROM python:3.12-slim-bookworm
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
WORKDIR /opt/program
EXPOSE 8080
# For docker itself (SageMaker runs its own health check on /ping): 200 only once the model is
# loaded, so a long start period covers the download and load.
HEALTHCHECK --interval=30s --timeout=3s --start-period=30m --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/ping', timeout=2)"]
# `docker run mazerl-serve serve` runs `maze-serve serve`: 0.0.0.0:8080, model and adapter
# from the SageMaker environment (SM_MODEL_DIR, MAZE_MODEL, MAZE_ADAPTER).
ENTRYPOINT ["maze-serve"]
CMD ["serve"]
