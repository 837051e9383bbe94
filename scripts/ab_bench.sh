#!/usr/bin/env bash
# A/B of kernel variants (git refs) in one device call, so they share the GPU, its clocks and
# the run's conditions.
#
#   scripts/ab_bench.sh prepare REF...   on the dev machine: ab/<ref>/ = git archive of the
#                                        ref's kvkit, cuda_src, benchmarks, scripts, tests
#                                        (untracked, so the device tool carries them)
#   scripts/ab_bench.sh run [ARGS...]    on the GPU machine: for every ab/<ref>, the decode
#                                        GPU tests when AB_TESTS=1 (or when AB_TESTS is a
#                                        substring of the tree's name; AB_TEST_FILES: which
#                                        test files, default the decode and plan GPU tests),
#                                        then benchmarks/run.py
#                                        ARGS (default: --no-write --shapes 64x8192,1x131072,
#                                        8x8192,1x4096) into $OUT/<ref>/, then a side-by-side
#                                        table (scripts/ab_compare.py; the first ref is the base)
#   scripts/ab_bench.sh clean            remove ab/
set -u
cd "$(dirname "$0")/.."
cmd=${1:-}
shift || true
case $cmd in
  prepare)
    [ $# -ge 1 ] || { echo "usage: $0 prepare REF..."; exit 2; }
    rm -rf ab && mkdir -p ab
    i=0
    for ref in "$@"; do
      i=$((i + 1))
      dir="ab/$(printf '%02d' $i)-$(echo "$ref" | tr '/' '_')"
      mkdir -p "$dir"
      git archive "$ref" kvkit cuda_src benchmarks scripts tests examples setup.cfg pyproject.toml \
        pytest.ini |
        tar -x -C "$dir" || exit 1
      echo "$dir <- $(git rev-parse --short "$ref")"
    done ;;
  run)
    OUT=${OUT:-$PWD/ab_out}
    mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1 KVKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-dev}
    args=("$@")
    [ ${#args[@]} -gt 0 ] || args=(--no-write --shapes 64x8192,1x131072,8x8192,1x4096)
    specs=()
    for dir in ab/*/; do
      name=$(basename "$dir")
      # One cache for every tree: a key covers the whole inlined source, so a kernel the trees
      # share compiles once (kvkit/cuda/compiler.py reuses files across processes).
      export KVKIT_CACHE_DIR=/tmp/kvkit_ab_cache
      tests=${AB_TESTS:-0}
      if [ "$tests" = 1 ] || { [ "$tests" != 0 ] && [[ $name == *"$tests"* ]]; }; then
        (cd "$dir" && PYTHONPATH=. timeout "${T_TESTS:-240}" python -m pytest -q -x -m gpu \
          ${AB_TEST_FILES:-tests/cuda/test_decode_gpu.py tests/cuda/test_plan_gpu.py} \
          -p no:cacheprovider) \
          > "$OUT/$name.tests.txt" 2>&1
        echo "$name tests rc=$? $(tail -n 1 "$OUT/$name.tests.txt")"
      fi
      (cd "$dir" && PYTHONPATH=. timeout "${T_BENCH:-200}" python benchmarks/run.py \
        --out "$OUT/$name" "${args[@]}") > "$OUT/$name.bench.txt" 2>&1
      echo "$name bench rc=$?"
      [ -f "$OUT/$name/bench.json" ] && specs+=("$name=$OUT/$name/bench.json")
    done
    [ ${#specs[@]} -gt 0 ] && PYTHONPATH=. python scripts/ab_compare.py "${specs[@]}" |
      tee "$OUT/ab.txt" ;;
  clean)
    rm -rf ab ;;
  *)
    echo "usage: $0 prepare REF... | run [BENCH ARGS...] | clean"; exit 2 ;;
esac
