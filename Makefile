# Two commands on a fresh machine: `make demo` (the whole screen on an embedded default) and `make test`.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

.PHONY: demo test lint
demo: $(STAMP)
	$(VENV)/bin/pool-demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy pool_queue workers
