# One command each: `make demo` (set up + run the main job), `make test` (set up + run the tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint typecheck docs dist wheel-check check bench vision-data clean

$(BIN)/ngvi: pyproject.toml requirements-ci.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements-ci.txt
	$(BIN)/pip install -q -e ".[experiments,dev,docs]"
	@$(BIN)/python -c "import torch, sys; v = torch.__version__; print('torch', v); sys.exit(0 if v.startswith('2.13.0') else 'torch must stay 2.13.0, got ' + v)"
	@touch $@

setup: $(BIN)/ngvi

demo: setup
	$(BIN)/ngvi demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup lint
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q

# mypy on the public modules, with the settings in pyproject.toml's [tool.mypy]
typecheck: setup
	$(BIN)/mypy

# the API reference site (mkdocs.yml) into site/; --strict: a broken link or a missing page fails it, and
# tools/check_api_docs.py fails on a public name without a docstring or a reference entry
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
	$(BIN)/python tools/check_api_docs.py site

# an sdist and a wheel in dist/, checked by twine
dist: setup
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .
	$(BIN)/twine check --strict dist/*

# the wheel in a clean venv (torch as CI pins it, numpy from the wheel's metadata) runs the README's quickstart
wheel-check: dist
	$(BIN)/python tools/check_wheel.py dist

# what CI runs besides the tests (.ci/run): types, the docs site, the wheel
check: typecheck docs wheel-check

bench: setup
	$(BIN)/ngvi bench

# Fashion-MNIST, the out-of-distribution set of `ngvi classify`, from Debian's package (needs root/apt)
vision-data:
	@test -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz || \
		(apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache site dist
