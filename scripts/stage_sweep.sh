#!/usr/bin/env bash
# Decode time per staging budget (KVKIT_DECODE_STAGE_KB: cp.async / bulk stages per CTA) in one
# device call, side by side (scripts/ab_compare.py; the first column is the built-in budget).
#
#   OUT=... SWEEP_KB="40 56" SWEEP_FORMATS=nvfp4,fp8_e4m3 SWEEP_SHAPES=64x8192,1x131072 \
#     bash scripts/stage_sweep.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/sweep_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KVKIT_REQUIRE_GPU=1
F=${SWEEP_FORMATS:-nvfp4,turboquant_4bit_nc,turboquant_3bit_nc,turboquant_k8v4,fp8_e4m3}
S=${SWEEP_SHAPES:-64x8192,1x131072}
specs=()
for kb in default ${SWEEP_KB:-40 56}; do
  if [ "$kb" = default ]; then unset KVKIT_DECODE_STAGE_KB; else export KVKIT_DECODE_STAGE_KB=$kb; fi
  timeout "${T_SWEEP:-150}" python benchmarks/run.py --no-write --formats "$F" --shapes "$S" \
    --out "$OUT/kb_$kb" > "$OUT/kb_$kb.txt" 2>&1
  echo "stage budget $kb: rc=$?"
  [ -f "$OUT/kb_$kb/bench.json" ] && specs+=("kb_$kb=$OUT/kb_$kb/bench.json")
done
unset KVKIT_DECODE_STAGE_KB
[ ${#specs[@]} -gt 0 ] && python scripts/ab_compare.py "${specs[@]}" | tee "$OUT/sweep.txt"
