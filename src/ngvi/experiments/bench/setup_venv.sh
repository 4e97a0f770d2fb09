#!/usr/bin/env bash
# A separate virtual environment for the benchmark references, so that the project's own .venv never gets
# them. torch stays 2.13.0: the references are installed with --no-deps (with the two small pure-Python
# packages BackPACK imports), and the script checks the torch version at the end.
#
#   bash src/ngvi/experiments/bench/setup_venv.sh [VENV]        # default VENV: ../bench-venv
#   PYTHONPATH=src VENV/bin/python -m ngvi.cli bench --out docs/results/bench --noise-variants
set -euo pipefail
VENV=${1:-../bench-venv}
TORCH=${TORCH:-torch==2.13.0}   # or a wheel file, e.g. /opt/wheels/torch-2.13.0+cpu-...whl
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "$TORCH" numpy scipy matplotlib tqdm optuna   # ngvi's own dependencies
"$VENV/bin/pip" install -q --no-deps ivon-opt backpack-for-pytorch einops unfoldNd
"$VENV/bin/python" - <<'PY'
import sys, torch
import ivon, backpack  # both must import with this torch
from backpack.extensions import SumGradSquared  # noqa: F401
print("torch", torch.__version__, "| ivon-opt and backpack-for-pytorch import")
sys.exit(0 if torch.__version__.startswith("2.13.0") else "torch must stay 2.13.0")
PY
