#!/usr/bin/env bash
# The committed results of docs/results/vision, in one go (run from the repository root, as
# `bash docs/results/vision/run.sh`, one torch thread). Each step prints its wall time.
set -eu
export NGVI_DATA="${NGVI_DATA:-../shared/data}"
step() { local start; start=$(date +%s); "$@"; echo "[wall] $(( $(date +%s) - start )) s: $*"; }
step .venv/bin/ngvi classify --train-size 30000 --epochs 3 --jobs 1 --out docs/results/vision/mnist-cnn
step .venv/bin/ngvi classify --train-size 30000 --epochs 3 --batch-norm --methods map,vogn,noisy_kfac,kfac --jobs 1 \
    --out docs/results/vision/mnist-cnn-bn
step .venv/bin/python -m ngvi.experiments.vision.sampling_bench --out docs/results/vision --repeats 3
