# The project's checks, one target each. README.md and CONTRIBUTING.md quote these targets, .ci/run (CI) runs
# `make ci`, and `make -n TARGET` prints what a target would run. Run them in the venv the README makes (PYTHON is
# the interpreter on PATH unless given: make fast PYTHON=.venv/bin/python).
PYTHON ?= python
FLOOR_VENV ?= .venv-floor
FLOOR_TESTS ?= tests
# The oldest torch that pyproject.toml allows ("torch>=X.Y"), as the release X.Y.0 that `make floor` installs.
TORCH_FLOOR = $(shell sed -n 's/^dependencies = .*"torch>=\([0-9]*\.[0-9]*\)".*/\1.0/p' pyproject.toml)

.PHONY: fast test docs experiments colab package floor lint ci

# The fast tier: the unit tests not marked slow. The edit-and-test loop; the goal is under a minute on 2 cores.
fast:
	$(PYTHON) -m pytest -q -m "not slow" tests

# Every claim checked: the unit tests, every notebook under strict nbval, and the website built (make docs) and
# opened in headless Chromium (tests/test_site.py).
test:
	$(PYTHON) -m pytest --site --nbval --nbval-current-env tests notebooks

# The website, as published: warnings are errors, and so is a broken internal link or image (docs/_ext/sitecheck.py).
docs:
	$(PYTHON) -m sphinx -W --keep-going -b html -d docs/_build/doctrees docs docs/_build/html

# The experiments whose results ship in mha/data, rerun and compared (notebook 03's sweep for two seeds, the seeds
# notebook 05 reads): minutes.
experiments:
	$(PYTHON) -m pytest -q --experiment -m experiment tests

# Every chapter as in Colab: a fresh venv with torch, nothing but the notebook's install cell (tests/test_colab.py).
colab:
	$(PYTHON) -m pytest -q --colab tests/test_colab.py

# The package: sdist and wheel built, twine check --strict, the wheel alone with torch in a fresh venv.
package:
	$(PYTHON) -m pytest -q --package tests/test_packaging.py

# The oldest torch that pyproject.toml allows, in a venv of its own: the unit tests, then every notebook under strict
# nbval with a learner's matplotlibrc (figure.dpi 72) and a 40-column terminal (case C13). From PyPI this torch is the
# CUDA build (about 3 GB); it runs on the CPU like any other.
floor:
	python3 -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/pip install -q "torch==$(TORCH_FLOOR)"
	$(FLOOR_VENV)/bin/pip install -q -e ".[test]"
	$(FLOOR_VENV)/bin/python -c 'import torch, sys; print("torch", torch.__version__); sys.exit(torch.__version__.split("+")[0] != "$(TORCH_FLOOR)")'
	$(FLOOR_VENV)/bin/python -m pytest -q $(FLOOR_TESTS)
	MATPLOTLIBRC=.ci/matplotlibrc COLUMNS=40 LINES=10 $(FLOOR_VENV)/bin/python -m pytest -q --nbval --nbval-current-env notebooks

lint:
	$(PYTHON) -m ruff check mha tests notebooks benchmarks experiments docs

# CI, in the venv .ci/run makes: every check above, then nothing changed in the working tree.
ci: test experiments colab package floor lint
	@test -z "$$(git status --porcelain)" || { git status --short; echo "CI changed the working tree" >&2; exit 1; }
