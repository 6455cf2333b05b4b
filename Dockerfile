# One image for the server and the workers. Builds from the package registries only
# (Debian's packages and PyPI). Not built on the development machines (no Docker engine
# there); `docker-compose config` validates the compose file in the tests.
FROM python:3.11-slim-bookworm

ARG TORCH_SPEC="torch==2.13.0"
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap libseccomp2 \
 && rm -rf /var/lib/apt/lists/*

# Jobs run as this user inside the sandbox; the worker itself runs as it too.
RUN useradd --create-home --uid 10001 inspector
WORKDIR /app
COPY pyproject.toml README.md ./
COPY inspector ./inspector
COPY server ./server
COPY migrations ./migrations
COPY alembic.ini ./
COPY templates ./templates
COPY static ./static
RUN pip install --no-cache-dir "$TORCH_SPEC" \
 && pip install --no-cache-dir ".[postgres,redis,sandbox,hf]" "$TORCH_SPEC"

USER inspector
ENV INSPECTOR_DATA_DIR=/data
EXPOSE 8000
CMD ["inspector", "serve", "--host", "0.0.0.0", "--port", "8000"]
