# syntax=docker/dockerfile:1
# The documented way to deploy (docs/deploy.md): `docker build -t helpdesk-bot .`, then `docker compose up`.
# PYTHON_IMAGE: any Debian-based image with Python 3.11 to 3.13 as `python` and its `venv` module.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
# EXTRAS: optional extras of the project to install too, e.g. `--build-arg EXTRAS=otel` (docs/operations.md).
ARG EXTRAS=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# .dockerignore lets in only the packages, the migrations, pyproject.toml and constraints.txt when there is one.
COPY . .
# A wheel, installed with its runtime dependencies only (no dev extra; EXTRAS if given), pinned by constraints.txt
# when present; pip and setuptools then leave the virtualenv, which is all the final stage takes.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip wheel --no-deps --wheel-dir /tmp/wheels . \
 && if [ -f constraints.txt ]; then pinned="--constraint constraints.txt"; else pinned=""; fi \
 && wheel=$(echo /tmp/wheels/*.whl) \
 && /opt/venv/bin/pip install $pinned "$wheel${EXTRAS:+[$EXTRAS]}" \
 && /opt/venv/bin/pip uninstall --yes pip setuptools \
 && /opt/venv/bin/python -m bot --version

FROM ${PYTHON_IMAGE}
# Not root: Postgres will not run as root, so the embedded one (DATABASE_URL unset) runs as this user too.
RUN groupadd --system --gid 10001 helpdesk \
 && useradd --system --uid 10001 --gid helpdesk --home-dir /data --no-create-home --shell /usr/sbin/nologin helpdesk \
 && install -d -o helpdesk -g helpdesk -m 0750 /data
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DATA_DIR=/data \
    PORT=3000
# ./helpdesk.yaml and ./.env are read from here when mounted; local state (the embedded Postgres) goes to DATA_DIR.
WORKDIR /app
USER helpdesk
VOLUME ["/data"]
EXPOSE 3000
# /livez is on PORT in every role and whatever METRICS_PORT and METRICS_TOKEN say (/healthz moves with them):
# the process is up and its workers started. The first start of an empty database stores the knowledge first.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/livez' % os.environ.get('PORT', '3000'), timeout=4)"]
ENTRYPOINT ["python", "-m", "bot"]
CMD ["serve"]
