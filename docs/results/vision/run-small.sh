#!/usr/bin/env bash
# The small committed runs (each well under 3 CPU-minutes): 10,000 training images, 2 epochs, 16 test-time
# samples, half the OOD set and 1,000 images per rotation angle. Run from the repository root; each step prints
# its wall time. (run.sh is the larger protocol: 30,000 images, 3 epochs, 32 samples.)
set -eu
export NGVI_DATA="${NGVI_DATA:-../shared/data}" OMP_NUM_THREADS=1
step() { local start; start=$(date +%s); "$@"; echo "[wall] $(( $(date +%s) - start )) s: $*"; }
small=(--train-size 10000 --epochs 2 --test-samples 16 --ood-size 5000 --shift-size 1000 --jobs 1)
step .venv/bin/ngvi classify "${small[@]}" --out docs/results/vision/mnist-cnn-10k
step .venv/bin/ngvi classify "${small[@]}" --batch-norm --methods map,vogn,noisy_kfac --out docs/results/vision/mnist-cnn-bn-10k
