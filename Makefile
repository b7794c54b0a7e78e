# Entry points for people and CI alike: `make repro`, `make test` (`make test-fast` for the quick subset), `make check`.
# Both first install requirements.txt into .venv, and skip that when it is already up to date.

PYTHON ?= python3
PIP_VERSION := 26.3
VENV := .venv
BIN := $(abspath $(VENV))/bin
INSTALLED := $(VENV)/.installed
# Stages run as `python -m stages.X`: put the venv first so DVC finds its python.
export PATH := $(BIN):$(PATH)
# uv installs without compiling bytecode (pip compiles at install): Python writes each module's .pyc at its first
# import and reads it from then on. With PYTHONDONTWRITEBYTECODE set it never writes one, and every process compiles
# the sources of torch, MLflow and DVC it imports anew (seconds per stage: docs/measurements.md), so these targets
# leave it unset.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install repro handin-views test test-all test-fast test-stress test-stress-sample test-browser screenshots check requirements

install: $(INSTALLED)

# uv (pinned in requirements.txt, installed by pip first) installs the same pins several times faster than pip
# (docs/measurements.md); where uv cannot run, pip installs them. Either way the line `install: ... by uv|pip` says
# which one ran.
UV_PIN = $(shell grep -m1 '^uv==' requirements.txt)

$(INSTALLED): requirements.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check pip==$(PIP_VERSION) $(UV_PIN)
	@if $(BIN)/uv pip install --quiet --python $(BIN)/python -r requirements.txt; then \
	  echo "install: requirements.txt installed by uv ($$($(BIN)/uv --version))"; \
	else \
	  echo "install: uv could not install requirements.txt; installing with pip instead" >&2; \
	  $(BIN)/python -m pip install --quiet -r requirements.txt \
	    && echo "install: requirements.txt installed by pip ($$($(BIN)/python -m pip --version | cut -d' ' -f1-2))"; \
	fi
	@touch $@

repro: install
	dvc repro

# Everything but the stress and browser tests, the slow ones of one slot of the rotating tier
# (tests/helpers/rotation.py), picked by the commit count, so that any three consecutive commits run all of it;
# ROTATION=<n> picks another. `make test-all` runs the whole tier, the browser tests included.
ROTATION_NOW = $${ROTATION:-$$(git rev-list --count HEAD 2>/dev/null || echo all)}
test: install
	LAB_ROTATION="$(ROTATION_NOW)" python -m pytest

test-all: install
	LAB_ROTATION=all python -m pytest
	LAB_ROTATION=all python -m pytest -m browser tests/browser

# Everything but the `slow` (and browser) tests (real dvc CLI, real training), on two workers.
test-fast: install
	python -m pytest -m "not slow and not browser"

# SIGINT and SIGTERM at ten moments of a training stage, alone, through `dvc repro` and `dvc queue kill`, and the
# class server's outages; a SIGKILL at the steps of the report's, profile@cpu's and train's output swaps
# (test_swap_stress, about 24 minutes, scheduled first) and a queue kill during profile@cpu's timing and the report,
# with every MLflow run's status checked. They mostly wait (on celery, on retries, on a stopped server), so three
# workers on two cores finish sooner than two (docs/measurements.md); each stop's 10 s limit holds.
test-stress: install
	python -m pytest -m stress -n 3

# CI's share of test-stress (.ci/run): the train stage's stage-alone, `dvc repro` and `dvc queue kill` paths, both
# signals, at one of the ten moments, and one of the three stages stopped every way through `dvc repro` at that moment:
# MOMENT=<name> and STAGE=<name> (tests/helpers/stress.py), else those the commit count picks, so that any 30
# consecutive commits cover them all. Not the class server's outages. Its three modules on three workers, as
# test-stress: they mostly wait.
test-stress-sample: install
	LAB_STRESS_MOMENTS="$${MOMENT:-$$(python -c 'import sys; from tests.helpers.stress import moment_for; \
	print(moment_for(int(sys.argv[1])))' "$$(git rev-list --count HEAD)")}" \
	LAB_STRESS_STAGES="$${STAGE:-$$(python -c 'import sys; from tests.helpers.stress import stage_for; \
	print(stage_for(int(sys.argv[1])))' "$$(git rev-list --count HEAD)")}" \
	python -m pytest -m stress -n 3 tests/test_signal_stress.py tests/test_signal_stress_queue.py \
	tests/test_signal_stress_stages.py

# MLflow's, TensorBoard's and the hand-in's pages rendered in headless Chromium (Debian package `chromium`): not part
# of `make test`. The browser modules of the slot `make test` picks (tests/helpers/rotation.py), on two workers; they
# read the reproduced project the last `make test` of this same tree left in .pytest_cache
# (tests/browser/conftest.py), else build one. ROTATION=all runs every one.
test-browser: install
	LAB_ROTATION="$(ROTATION_NOW)" python -m pytest -m browser tests/browser

# TensorBoard's GRAPHS and SCALARS views of the current training, photographed in headless Chromium (Debian package
# `chromium`) into views/, then the report stage puts them in the hand-ins' 截图 cells.
handin-views: install
	python -m pipeline.report.tensorboard_views
	dvc repro report

# The lab guide's pictures (docs/images) retaken from this project's last `dvc repro`, each only once its page shows
# what docs/lab-guide.md says it shows.
screenshots: install
	python -m tests.helpers.guide

# Lint, format, types and the import rules between the wings (pyproject.toml): what CI runs before the tests.
check: install
	ruff check .
	ruff format --check .
	mypy
	lint-imports

# Re-pin after changing the ranges in pyproject.toml.
requirements: install
	{ sed -n '1,2p' requirements.txt; python -m pip freeze --all --exclude pip; } > requirements.txt.new
	mv requirements.txt.new requirements.txt
