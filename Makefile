# Two entry points for a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build: a plain `torch` would pull a multi-GB CUDA build. Override for GPU hosts.
TORCH_SPEC ?= torch==2.13.0
# The tested versions of everything else (see its header); `CONSTRAINTS=` installs the newest.
CONSTRAINTS ?= constraints.txt
PIN := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
STAMP_RUN := $(VENV)/.installed-run
STAMP_TEST := $(VENV)/.installed-test
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: serve test lint format install install-test system-deps bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP_RUN): pyproject.toml $(CONSTRAINTS) | $(PY)
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q $(PIN) -e ".[postgres,redis,sandbox,hf,models]" "$(TORCH_SPEC)"
	touch $@

$(STAMP_TEST): pyproject.toml $(STAMP_RUN)
	$(PIP) install -q $(PIN) -e ".[test]" "$(TORCH_SPEC)"
	touch $@

install: $(STAMP_RUN) system-deps
install-test: $(STAMP_TEST) system-deps

# bubblewrap for the job sandbox, Debian's chromium for the browser tests, docker-compose
# to validate docker-compose.yml (tests/test_deploy.py; no Docker engine needed).
system-deps:
	@need=""; \
	command -v bwrap >/dev/null || need="$$need bubblewrap"; \
	command -v chromium >/dev/null || need="$$need chromium"; \
	command -v docker-compose >/dev/null || need="$$need docker-compose"; \
	if [ -n "$$need" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing:$$need"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need >/dev/null; \
	  else \
	    echo "warning: missing$$need (install them with your package manager)"; \
	  fi; \
	fi

serve: install
	$(VENV)/bin/inspector serve --host $(HOST) --port $(PORT)

test: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format:
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: install-test
	$(PY) bench/core.py

clean:
	rm -rf $(VENV) inspector-data .pytest_cache .ruff_cache
