#!/usr/bin/env bash
# TurboQuant write time per launch setting (KVKIT_WRITE_TQ_RPW rows per warp,
# KVKIT_WRITE_TQ_MIN_CTAS launch-bounds minimum) in one device call, side by side
# (scripts/ab_compare.py --write; the first column is the launcher's default).
#
#   OUT=... WSWEEP="4:8 2:8 2:10 1:16" WSWEEP_FORMATS=turboquant_4bit_nc bash scripts/write_sweep.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/wsweep_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KVKIT_REQUIRE_GPU=1
F=${WSWEEP_FORMATS:-turboquant_4bit_nc,turboquant_3bit_nc,turboquant_k8v4}
specs=()
for cfg in default ${WSWEEP:-4:8 2:8 2:10 1:16}; do
  if [ "$cfg" = default ]; then
    unset KVKIT_WRITE_TQ_RPW KVKIT_WRITE_TQ_MIN_CTAS
  else
    export KVKIT_WRITE_TQ_RPW=${cfg%%:*} KVKIT_WRITE_TQ_MIN_CTAS=${cfg##*:}
  fi
  tag=w_${cfg/:/_}
  timeout "${T_WSWEEP:-90}" python benchmarks/run.py --shapes 1x4096 --no-graph --formats "$F" \
    --out "$OUT/$tag" > "$OUT/$tag.txt" 2>&1
  echo "write setting $cfg: rc=$?"
  [ -f "$OUT/$tag/bench.json" ] && specs+=("$tag=$OUT/$tag/bench.json")
done
unset KVKIT_WRITE_TQ_RPW KVKIT_WRITE_TQ_MIN_CTAS
[ ${#specs[@]} -gt 0 ] && python scripts/ab_compare.py --write "${specs[@]}" | tee "$OUT/wsweep.txt"
