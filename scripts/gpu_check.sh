#!/usr/bin/env bash
# One call on a GPU machine: the GPU test suite natively and through the sm_80 / sm_89 PTX
# overrides, compute-sanitizer memcheck on one write and one decode per format (bad tables
# included), then a summary table (last lines of output) and JSON under $OUT.
#
#   PYTHONPATH is set to the source tree; nothing is installed.
#   OUT defaults to ./gpu_out; HYPOTHESIS_PROFILE defaults to ci.
#   GPU_CHECK_STEPS (optional): space-separated subset of: native sm80 sm89 memcheck bench
#     ncu ncuw host bench80 splits, run in the order given (default: native sm80 sm89
#     memcheck bench).
#     ncu = Nsight Compute on one stage-1 launch per format in NCU_FORMATS at NCU_SHAPE:
#       occupancy / issue / throughput lines into ncu.txt, the SASS source counters and
#       details per format in ncu.tgz (for scripts/ncu_sass.py);
#     ncuw = the same for one write_kv of 4M token-heads per format in NCU_WRITE_FORMATS
#       (ncu_write.txt, ncu_write.tgz);
#     host = scripts/host_overhead.py, the host time of a plain decode call and of
#       DecodePlan.run, and a cProfile, into host.txt;
#     bench80 = the decode benchmark at BENCH80_SHAPES through the sm_80 PTX override next to
#       the native one, side by side in bench80.txt (the issue's "sm_80 within 1.5x");
#     splits = scripts/split_sweep.py, graph time per split count at SWEEP_SHAPES, splits.txt.
#   T_SUITE / T_MEMCHECK / T_BENCH: per-step time limits in seconds (a lease call is 10 min)
#   BENCH_ARGS: extra arguments for benchmarks/run.py (e.g. --quick)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
export OUT
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KVKIT_REQUIRE_GPU=1
export KVKIT_CACHE_DIR=${KVKIT_CACHE_DIR:-/tmp/kvkit_cache}
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
STEPS=${GPU_CHECK_STEPS:-native sm80 sm89 memcheck bench}
LOG="$OUT/gpu_check.log"
: > "$LOG"
: > "$OUT/steps.tsv"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import cupy, sys; from cupy_backends.cuda.libs import nvrtc; \
print('python', sys.version.split()[0], 'cupy', cupy.__version__, 'nvrtc', nvrtc.getVersion())"
} 2>&1 | tee -a "$LOG"

step() {  # step NAME COMMAND...: run, log, record rc and seconds
  local name=$1; shift
  local t0=$(date +%s)
  echo "=== $name: $*" | tee -a "$LOG"
  "$@" > "$OUT/$name.part" 2>&1
  local rc=$?
  cat "$OUT/$name.part" >> "$LOG"
  tail -n 3 "$OUT/$name.part"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" \
    "$(grep -E '[0-9]+ (passed|failed|error)' "$OUT/$name.part" | tail -n 1)" >> "$OUT/steps.tsv"
  rm -f "$OUT/$name.part"
}

# ncu_profile KERNEL_REGEX SCRIPT TAG "FORMATS" [ARGS...]: Nsight Compute on the third launch
# of the matching kernel of scripts/SCRIPT per format: key lines into $OUT/TAG.txt, the SASS
# source counters and details into $OUT/TAG.tgz (scripts/ncu_sass.py reads the CSVs).
ncu_profile() {
  local regex=$1 script=$2 tag=$3 fmts=$4; shift 4
  local NCU W f
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  W=$(mktemp -d)
  for f in $fmts; do
    echo "== $f $*"
    timeout "${T_NCU:-120}" "$NCU" --kernel-name "regex:$regex" --launch-skip 2 \
      --launch-count 1 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section SchedulerStats --section LaunchStats \
      --section InstructionStats --section SourceCounters -o "$W/$f" -f \
      python "scripts/$script" "$f" "$@" > "$W/$f.log" 2>&1
    "$NCU" -i "$W/$f.ncu-rep" --print-details all > "$W/$f.details.txt" 2>&1
    "$NCU" -i "$W/$f.ncu-rep" --page source --csv --print-source sass > "$W/$f.sass.csv" 2>&1
    grep -E "Duration|Throughput|Registers Per|Dynamic Shared|Achieved|Theoretical Occ|Issued|Eligible|Active Warps|Grid Size|Waves|Executed Instructions  " \
      "$W/$f.details.txt"
  done | tee "$OUT/$tag.txt"
  (cd "$W" && tar czf "$OUT/$tag.tgz" ./*.sass.csv ./*.details.txt) && rm -rf "$W"
}
export -f ncu_profile

SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for s in $STEPS; do
  case $s in
    native)   step gpu_native timeout "${T_SUITE:-300}" python -m pytest -q -m gpu tests -p no:cacheprovider ;;
    sm80)     step gpu_sm80 env KVKIT_ARCH=sm_80 timeout "${T_SUITE:-300}" python -m pytest -q -m gpu tests -p no:cacheprovider ;;
    sm89)     step gpu_sm89 env KVKIT_ARCH=sm_89 timeout "${T_SUITE:-300}" python -m pytest -q -m gpu tests -p no:cacheprovider ;;
    memcheck) step memcheck timeout "${T_MEMCHECK:-240}" "$SAN" --tool memcheck --error-exitcode 3 \
                --print-limit 20 python scripts/sanitize_targets.py ;;
    host)     step host bash -c 'timeout 120 python scripts/host_overhead.py turboquant_4bit_nc 1 4096 |
                tee "$OUT/host.txt"' ;;
    bench80)  step bench80 bash -c 'S=${BENCH80_SHAPES:-64x8192,1x131072}
                timeout 200 python benchmarks/run.py --no-write --shapes $S --out "$OUT/b_native" &&
                KVKIT_ARCH=sm_80 timeout 200 python benchmarks/run.py --no-write --shapes $S \
                  --out "$OUT/b_sm80" &&
                python scripts/ab_compare.py native="$OUT/b_native/bench.json" \
                  sm80="$OUT/b_sm80/bench.json" | tee "$OUT/bench80.txt"' ;;
    splits)   step splits bash -c 'timeout 150 python scripts/split_sweep.py \
                --shapes "${SWEEP_SHAPES:-1x4096,1x32768,8x4096}" | tee "$OUT/splits.txt"' ;;
    bench)    step bench timeout "${T_BENCH:-480}" python benchmarks/run.py --out "$OUT" ${BENCH_ARGS:-} ;;
    ncu)      step ncu bash -c 'ncu_profile stage1 profile_decode.py ncu \
                "${NCU_FORMATS:-turboquant_4bit_nc fp16}" ${NCU_SHAPE:-64 8192}' ;;
    ncuw)     step ncuw bash -c 'ncu_profile kvkit_write profile_write.py ncu_write \
                "${NCU_WRITE_FORMATS:-turboquant_4bit_nc nvfp4 fp8_e4m3}"' ;;
  esac
done

python - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines() if line]
summary = [{"step": r[0], "rc": int(r[1]), "seconds": int(r[2]), "result": r[3] if len(r) > 3 else ""}
           for r in rows]
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print("\n==== gpu_check summary ====")
print(f"{'step':<12} {'rc':>3} {'sec':>5}  result")
for r in summary:
    print(f"{r['step']:<12} {r['rc']:>3} {r['seconds']:>5}  {r['result']}")
PY
rm -f "$OUT/steps.tsv"
