# syntax=docker/dockerfile:1
# One image for every jobfence function: `jobfence <function>` is the entrypoint, the
# manifests pass the function as args. Build with `make image` (IMAGE=...), or
# `docker build -t registry/jobfence:TAG .` as it is.
ARG PYTHON_IMAGE=python:3.11-slim
# The build stage's base: the same Python unless told otherwise. devtools/image.py passes one
# that carries the dependencies' wheels (PIP_NO_INDEX, PIP_FIND_LINKS) where the builder has
# no network.
ARG BUILD_IMAGE=${PYTHON_IMAGE}

# Build stage: jobfence and every dependency as wheels. psycopg comes as psycopg[binary],
# so nothing here compiles against libpq. The image has the extra `otel`: traces are then a
# matter of the OTEL_* variables (nothing of it is loaded while they ask for none).
FROM ${BUILD_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY functions ./functions
RUN pip wheel --wheel-dir /wheels ".[otel]"

# Final stage: the same slim Python with the installed wheels only; no compiler, no build
# tree, no wheel files left behind (they are mounted from the build stage, not copied).
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
# tini is PID 1: it passes SIGTERM on to jobfence (a Python PID 1 gets only the signals it
# handles) and reaps orphaned processes of a job's command. Installed unless the base has it
# (a base made without network access brings its own). jobfence uses the kubernetes client's
# synchronous half only: its asyncio copy (kubernetes.aio, ~40 MB with its bytecode) is left
# out of the image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    if [ ! -x /usr/bin/tini ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends tini \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && pip install --no-cache-dir --no-index --find-links=/wheels "jobfence[otel]" \
    && rm -rf "$(python -c 'import importlib.util as u; \
        print(u.find_spec("kubernetes").submodule_search_locations[0])')/aio" \
    && groupadd --gid 10001 jobfence \
    && useradd --uid 10001 --gid 10001 --no-create-home \
        --home-dir /tmp --shell /usr/sbin/nologin jobfence \
    && groupadd --gid 10002 jobfence-jobs \
    && useradd --uid 10002 --gid 10002 --no-create-home \
        --home-dir /tmp --shell /usr/sbin/nologin jobfence-jobs
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd. The
# worker pods' command sidecar, and so the jobs' commands, run as 10002 (jobfence-jobs):
# never the worker's uid.
USER 10001:10001
# The root filesystem is read-only in the pods; /tmp is their one writable volume.
ENV HOME=/tmp
WORKDIR /tmp
ENTRYPOINT ["/usr/bin/tini", "--", "jobfence"]
CMD ["--help"]
