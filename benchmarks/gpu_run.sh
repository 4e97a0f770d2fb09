#!/usr/bin/env bash
# One lent GPU run of issues 30 and 34's device checks, in the order of what matters most (each part bounded,
# everything it prints in $OUT/log.txt). ivon-opt travels as a wheel in .whl/ (see the device notes).
#   bash benchmarks/gpu_run.sh                       # on the GPU machine, from the repository root, $OUT set
#   LM_ONLY="AdamW (fused);IVON (device)" ROUNDS=9 bash benchmarks/gpu_run.sh     # a subset of the LM bench
set -u
site=$(mktemp -d)
export PYTHONUNBUFFERED=1 PYTHONPATH=src:$site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
log=$OUT/log.txt
part() { echo "=== $* ($(date +%T))" >>"$log"; }
part env; { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"; } >>"$log" 2>&1
part checks; timeout 60 python3 benchmarks/gpu_checks.py 2>&1 | grep -v USDT >>"$log"
part lm; timeout 200 python3 benchmarks/gpu_lm.py --out "$OUT/gpu" --rounds "${ROUNDS:-5}" --steps "${STEPS:-8}" \
  --top "IVON (device)" --only "${LM_ONLY:-}" 2>&1 | grep -v "USDT\|^built\|^ *aten::\|^ *cuda" >>"$log"
part compiled; timeout 200 python3 benchmarks/gpu_lm.py --out "$OUT/compiled" --rounds 5 --steps 8 --compile \
  --only "AdamW (fused);forward + backward;IVON (device);Vadam (device);IVON (device, compiled);Vadam (device, compiled)" \
  2>&1 | grep -v "USDT\|^built\|^ *aten::\|^ *cuda" >>"$log"
part fsdp; timeout 60 python3 examples/fsdp_ivon.py --width 4096 --steps 100 --compare-adamw 2>&1 | grep -v USDT >>"$log"
part done
