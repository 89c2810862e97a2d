# syntax=docker/dockerfile:1
# One image for every jobfence function: `jobfence <function>` is the entrypoint, the
# manifests pass the function as args. Build with `make image` (IMAGE=...).
ARG PYTHON_IMAGE=python:3.11-slim

# Build stage: jobfence and every dependency as wheels. psycopg comes as psycopg[binary],
# so nothing here compiles against libpq. The image has the extra `otel`: traces are then a
# matter of the OTEL_* variables (nothing of it is loaded while they ask for none).
FROM ${PYTHON_IMAGE} AS build
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
    PIP_DISABLE_PIP_VERSION_CHECK=1
# tini is PID 1: it passes SIGTERM on to jobfence (a Python PID 1 gets only the signals it
# handles) and reaps orphaned processes of a job's command.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir --no-index --find-links=/wheels "jobfence[otel]" \
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
