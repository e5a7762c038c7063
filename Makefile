# Two commands on a fresh machine: `make demo` (the whole screen on an embedded default) and `make test`.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# The real-vLLM tests' own environment (a CPU build of vLLM), kept out of the project's dependencies.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

$(VLLM_STAMP): tests/realvllm/requirements.txt
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q -r tests/realvllm/requirements.txt
	# CUDA-linked audio/video decoders that cannot load beside the CPU torch; the image path needs neither
	$(VLLM_VENV)/bin/pip uninstall -y -q torchaudio torchcodec
	touch $(VLLM_STAMP)

.PHONY: demo test lint
demo: $(STAMP)
	$(VENV)/bin/pool-demo

test: $(STAMP) $(VLLM_STAMP)
	$(VENV)/bin/ruff check .
	POOL_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(VENV)/bin/pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy pool_queue workers
