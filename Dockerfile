# syntax=docker/dockerfile:1
#
# The Lorenz image: the `lorenz` console script installed from the project's wheel, run as an
# unprivileged user. The default command is the Kubernetes operator (`lorenz operator`); the
# same image runs single-host mode with `docker run ... lorenz WORKFLOW.md`.
#
# Build:   docker build -t lorenz:0.1.0 .
# Pinning: the base is pinned by its full version tag here. NB: a tag can be re-pushed, so CI
#          (which can pull) should pass the digest it resolved, e.g.
#          docker build --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest> .
#          Both stages use the same base, so the wheel is built by the interpreter that runs it.
#
# tests/packaging/test_dockerfile.py checks this file's structure (pinned bases, non-root
# numeric USER, exec-form ENTRYPOINT, no build tools in the final stage).

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# ---------------------------------------------------------------------------------------------
# builder: wheels for lorenz and every dependency, so the final stage installs offline.
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps the context to these files too).
COPY pyproject.toml README.md ./
COPY controller ./controller
RUN pip wheel --wheel-dir /wheels . \
 && ls /wheels/lorenz-*.whl

# ---------------------------------------------------------------------------------------------
# final: the runtime only — no compilers, no source tree, no pip cache.
FROM ${PYTHON_IMAGE} AS final

ARG LORENZ_UID=10001
ARG LORENZ_GID=10001

LABEL org.opencontainers.image.title="lorenz" \
      org.opencontainers.image.description="Turns issue-tracker work into coding-agent runs; Kubernetes operator and single-host service." \
      org.opencontainers.image.licenses="Apache-2.0"

# git: workspaces (worktree kind) and the usual hooks clone and fetch repositories.
# ca-certificates: HTTPS to trackers and git remotes. openssh-client: git over ssh.
RUN apt-get update \
 && apt-get install -y --no-install-recommends git ca-certificates openssh-client \
 && rm -rf /var/lib/apt/lists/*

# NB: a numeric UID (not just a name) so that Kubernetes' runAsNonRoot can verify it.
RUN groupadd --system --gid "${LORENZ_GID}" lorenz \
 && useradd --system --uid "${LORENZ_UID}" --gid "${LORENZ_GID}" \
        --home-dir /home/lorenz --create-home --shell /bin/bash lorenz \
 && mkdir -p /var/lib/lorenz/workspaces \
 && chown -R "${LORENZ_UID}:${LORENZ_GID}" /var/lib/lorenz

# The wheels are bind-mounted from the builder, never copied: no layer keeps them.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels lorenz \
 && lorenz --version

# NB: agents and hooks run under `bash -lc`, which needs HOME; in Kubernetes the chart mounts
# a writable emptyDir here because the root filesystem is read-only.
ENV HOME=/home/lorenz \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /home/lorenz
USER 10001:10001

# 8080: the liveness probe endpoint (kopf); 9090: the HTTP API and /metrics.
EXPOSE 8080 9090

ENTRYPOINT ["lorenz"]
CMD ["operator"]
