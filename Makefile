# One command each: `make demo` (set up + run the main job), `make test` (set up + run the tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint bench vision-data clean

$(BIN)/ngvi: pyproject.toml requirements-ci.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements-ci.txt
	$(BIN)/pip install -q -e ".[experiments,dev]"
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

bench: setup
	$(BIN)/ngvi bench

# Fashion-MNIST, the out-of-distribution set of `ngvi classify`, from Debian's package (needs root/apt)
vision-data:
	@test -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz || \
		(apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
