# `make demo` and `make test` work on a fresh clone: each creates .venv if missing, installs torch first
# (override TORCH for your accelerator, e.g. `make test TORCH="torch==2.13.0+cu128"`), then finecap with its
# test extras, then runs.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.finecap-installed

.PHONY: install demo test lint format bench browser

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

# The whole suite: the slow tests too (plain `pytest` leaves them out, pyproject.toml's addopts).
test: $(STAMP) browser
	$(BIN)/ruff check src tests benchmarks conftest.py
	$(BIN)/ruff format --check src tests benchmarks conftest.py
	$(BIN)/python -m pytest -q -m "slow or not slow"

format: $(STAMP)
	$(BIN)/ruff check --fix src tests benchmarks conftest.py
	$(BIN)/ruff format src tests benchmarks conftest.py

bench: $(STAMP)
	$(BIN)/python benchmarks/ngram_metrics.py
