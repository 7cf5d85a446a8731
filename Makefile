# date_optax: two commands do all set-up on a fresh machine.
#   make demo   creates .venv, installs the package, runs the main job on the CPU
#   make test   creates .venv, installs the test extras, runs the test suite
#   make docs   creates .venv, installs the docs extras, builds docs/_build/html
#
# JAX >= 0.11 needs Python >= 3.12. We prefer a working python3.12 (pyenv shims
# may exist without the version being active, so each candidate is *run*), and
# fall back to python3 (3.11 gets jax 0.10; the library supports both).

SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
PYTEST_ARGS ?=
JOBS ?= 2

PYTHON ?= $(shell \
  for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 \
           /usr/local/bin/python3.12 /usr/bin/python3.12 python3; do \
    if "$$p" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then \
      echo "$$p"; break; \
    fi; \
  done)

.PHONY: demo test test-all bench bench-device lint clean venv docs

$(VENV)/.created:
	@test -n "$(PYTHON)" || { echo "no Python >= 3.10 found" >&2; exit 1; }
	@echo "Creating $(VENV) with $(PYTHON) ($$($(PYTHON) --version))"
	$(PYTHON) -m venv $(VENV)
	@touch $@

$(VENV)/.installed: $(VENV)/.created pyproject.toml
	$(PY) -m pip install -q -e '.[examples]'
	@touch $@

$(VENV)/.installed-test: $(VENV)/.created pyproject.toml
	$(PY) -m pip install -q -e '.[test,examples]'
	@touch $@

$(VENV)/.installed-docs: $(VENV)/.created pyproject.toml
	$(PY) -m pip install -q -e '.[docs]'
	@touch $@

venv: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(PY) -m benchmarks.demo

test: $(VENV)/.installed-test
	$(PY) -m pytest -n $(JOBS) -q $(PYTEST_ARGS)

test-all: $(VENV)/.installed-test
	$(PY) -m pytest -n $(JOBS) -q -m '' $(PYTEST_ARGS)

lint: $(VENV)/.installed-test
	$(PY) -m pip install -q ruff
	$(VENV)/bin/ruff check date_optax tests benchmarks tpu examples

# The guide pages and the API reference from the docstrings; -W: a warning fails.
docs: $(VENV)/.installed-docs
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

bench: $(VENV)/.installed-test
	$(PY) benchmarks/optimizer_step.py

# The optimizer-step and train-step ratios on whatever JAX finds (GPU, TPU or
# the CPU), in about 4 minutes: BENCH_OUT/bench_device.{json,md}. On a machine
# without the venv (JAX preinstalled), `make bench-device BENCH_PY=python3`.
BENCH_OUT ?= tmp/bench_device
BENCH_PY ?= $(PY)
BENCH_ARGS ?=
bench-device: $(if $(filter $(PY),$(BENCH_PY)),$(VENV)/.installed-test,)
	PYTHONPATH=. $(BENCH_PY) benchmarks/bench_device.py --out $(BENCH_OUT) $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache docs/_build
