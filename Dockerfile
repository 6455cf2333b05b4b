# One image for the server and the workers (docker-compose.yml). Builds from the package
# registries only (Debian's packages and PyPI). Not built on the development machines (no
# Docker engine there); `docker-compose config` validates the compose file in the tests.
# GPU hosts: the default TORCH_SPEC pulls PyPI's CUDA build of torch on x86_64; CPU-only
# images: --build-arg TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
FROM python:3.11-slim-bookworm

ARG TORCH_SPEC="torch==2.13.0"
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap libseccomp2 \
 && rm -rf /var/lib/apt/lists/*

# Jobs run as this user inside the sandbox; the worker itself runs as it too.
RUN useradd --create-home --uid 10001 inspector
WORKDIR /app
COPY pyproject.toml README.md alembic.ini constraints.txt ./
COPY inspector ./inspector
COPY server ./server
COPY migrations ./migrations
COPY templates ./templates
COPY static ./static
# Editable: the server finds migrations/, templates/ and static/ next to its package.
RUN pip install --no-cache-dir $TORCH_SPEC \
 && pip install --no-cache-dir -c constraints.txt -e ".[postgres,redis,sandbox,hf,models,export]" $TORCH_SPEC

# The shared data volume: a named volume copies this directory's owner on first use.
RUN mkdir /data && chown inspector:inspector /data
USER inspector
ENV INSPECTOR_DATA_DIR=/data PYTHONUNBUFFERED=1
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=6 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=3)"
CMD ["inspector", "serve", "--host", "0.0.0.0", "--port", "8000"]
