# Two commands, each preparing what it needs in .venv on first use (a second call installs nothing):
#
#     make train                                   # python train.py: HalfCheetah-v5, 1M steps, one CPU learner
#     make train ARGS="--env-id Hopper-v5 --seed 2"
#     make test                                    # what CI runs (.ci/run): lint, format, the suite, dm_control's
#
# torch goes in first, on its own and pinned: left to resolve torch from the requirements, pip on Linux takes
# PyPI's CUDA build (gigabytes of NVIDIA libraries) even where no GPU is. So on Linux without an NVIDIA driver the
# CPU build's index is added (where its host resolves); TORCH_INDEX names another
# (TORCH_INDEX=https://download.pytorch.org/whl/cu128) or, empty, none (PyPI's own build). The manual steps, and installing from a wheel: docs/usage.md, "Installing".

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?= $(if $(filter Linux,$(shell uname -s)),$(if $(shell command -v nvidia-smi),,$(CPU_INDEX)))
# Only where its host resolves: behind a mirror (pip's own configuration), pip would retry it for every package.
CPU_INDEX = $(if $(shell getent hosts download.pytorch.org),https://download.pytorch.org/whl/cpu)
ARGS ?=
PYTEST_ARGS ?=

BIN := $(VENV)/bin
# The test command's own tools: the linter and formatter (ruff.toml), and the PostgreSQL driver of the search's
# shared-database test (tests/with_postgres.sh starts a server where the machine has one).
TEST_TOOLS := ruff==0.17.6 'psycopg[binary]==3.3.9'
# DeepMind Control's pins (pyproject's dmc extra) replace mujoco 4.0.0, so they go into a folder of their own that
# only its tests put on the path; with them, what dm_control needs that the venv lacks.
DMC_SITE := .dmc-site
DMC_PINS := $(shell sed -n 's/^dmc = \[\(.*\)\]$$/\1/p' pyproject.toml | tr -d ,)
DMC_DEPS := dm-env==1.6 dm-tree==0.1.10 labmaze==1.0.6 lxml==6.1.3 scipy==1.17.1

.PHONY: train test lint pytest dmc

train: $(VENV)/.train
	$(BIN)/python train.py $(ARGS)

test: lint pytest dmc

lint: $(VENV)/.test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The checkout's modules compiled first: where PYTHONDONTWRITEBYTECODE is set (CI's machines set it), each of the
# suite's interpreters (trainers, their actors' forkserver, scripts) would compile them again, ~0.8 s of CPU each.
pytest: $(VENV)/.test
	$(BIN)/python -m compileall -q ppo_ddp tests scripts examples train.py
	tests/with_postgres.sh $(BIN)/python -m pytest -q tests --durations=30 $(PYTEST_ARGS)

dmc: $(DMC_SITE)/.installed
	PYTHONPATH="$(abspath $(DMC_SITE))" $(BIN)/python -m pytest -q tests/test_dmc.py tests/test_presets.py -k dmc

# The training set: torch, then requirements.txt (every package pinned), then the checkout's package (its console
# scripts). A stamp per set: make reinstalls only when the file that pins it changes.
$(VENV)/.train: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(TORCH) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(BIN)/pip install -r requirements.txt
	$(BIN)/pip install --no-deps -e .
	$(BIN)/pip check
	touch $@

# The test set adds the extras whose tests run in the suite (requirements-extras.txt) and the test tools.
$(VENV)/.test: $(VENV)/.train requirements-extras.txt
	$(BIN)/pip install -r requirements-extras.txt $(TEST_TOOLS)
	$(BIN)/pip check
	touch $@

$(DMC_SITE)/.installed: $(VENV)/.train pyproject.toml
	$(BIN)/pip install --target $(DMC_SITE) --no-deps --upgrade $(DMC_PINS) $(DMC_DEPS)
	touch $@
