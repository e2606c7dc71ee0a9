#!/usr/bin/env bash
# The GPU acceptance run: the first thing to run on a GPU machine. On whatever GPUs are visible
# (one included), in under 8 minutes, everything lands under one folder:
#
#   doctor.json / doctor.txt    `cpbench doctor`: versions, GPUs, interconnect, usable kernels
#   cuda-kernels.txt            `pytest tests/test_cuda_kernels.py` (where pytest is installed):
#                               every usable kernel's op against float64 on this GPU
#   verify-<impl>.json          `cpbench verify` in bf16, every case of the world size, for
#                               cpbench and every external implementation doctor finds usable
#                               (verify-cpbench_flash_attn.json: cpbench with --kernel
#                               flash_attn, the document and window cases included)
#   verify-inference-<kernel>.json  `cpbench verify --inference --kernel K` in bf16 for each
#                               usable kernel: prefill by every scheme, decode over both cache
#                               layouts and both merges (all-gather, all-to-all), and the
#                               training cases, each kernel's refusals included
#   inference.toml, inference.jsonl  scenarios/gpu-inference.toml: prefill TTFT per scheme,
#                               decode latency and tokens/s, each point checked first
#   scenario.toml, sweep.jsonl  scenarios/gpu-acceptance.toml with the backend axis set to the
#                               usable kernels; every record carries its memory probes
#   efficiency.json             `cpbench efficiency` in bf16 at the world size (>= 2): cpbench's
#                               schemes and each usable library vs a single-GPU baseline
#   report.html, report.json    `cpbench report` of both sweeps
#   summary.md                  one page: kernel TFLOP/s, verify counts per kind (training,
#                               prefill, decode), TTFT and decode latency per scheme, memory
#                               sources, versions, the steps and their exit codes
#   steps.tsv, logs/            each step's exit code, seconds and stderr
#
# usage: benchmarks/gpu_acceptance.sh OUT_DIR [--dry-run]
#   --dry-run (or CPBENCH_ACCEPTANCE_DRY=1): the same steps on the CPU with tiny sizes, gloo,
#   2 ranks (the test suite runs it: tests/test_gpu_acceptance.py).
#   CPBENCH_PYTHON: the Python that has cpbench installed (default: python3).
#   CPBENCH_ACCEPTANCE_BUDGET: seconds for the whole run (default 470).
# Exit code: 0 when every step succeeded, 1 when one failed (a wrong result, a crash), 2 on bad
# usage or when no GPU is visible outside the dry run. The summary is written in every case.
set -uo pipefail

usage() { echo "usage: $0 OUT_DIR [--dry-run]" >&2; exit 2; }
OUT="" DRY="${CPBENCH_ACCEPTANCE_DRY:-0}"
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    -*) usage ;;
    *) [[ -z "$OUT" ]] || usage; OUT="$arg" ;;
  esac
done
[[ -n "$OUT" ]] || usage
[[ "$DRY" == 1 || "$DRY" == true ]] && DRY=1 || DRY=0

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
PY="${CPBENCH_PYTHON:-python3}"
BUDGET="${CPBENCH_ACCEPTANCE_BUDGET:-470}"
mkdir -p "$OUT/logs" || exit 2
OUT="$(cd "$OUT" && pwd)"
: > "$OUT/steps.tsv"
START=$(date +%s)
FAILED=0
export COLUMNS="${COLUMNS:-100}"
export PYTHONUNBUFFERED=1

# step NAME LIMIT STDOUT_FILE CMD...: run CMD with at most LIMIT seconds (and never past the
# budget), stdout to STDOUT_FILE, stderr to logs/NAME.log; append "NAME<TAB>rc<TAB>seconds".
step() {
  local name="$1" limit="$2" stdout="$3"
  shift 3
  local left=$(( START + BUDGET - $(date +%s) ))
  (( limit > left )) && limit=$left
  if (( limit < 5 )); then
    printf '%s\t%s\t%s\n' "$name" "skipped" 0 >> "$OUT/steps.tsv"
    echo "[acceptance] $name: skipped (time budget spent)" >&2
    return 0
  fi
  echo "[acceptance] $name (at most ${limit} s)" >&2
  local t0 rc
  t0=$(date +%s.%N)
  if command -v timeout > /dev/null; then
    (cd "$ROOT" && timeout --signal=INT --kill-after=20 "$limit" "$@") \
      > "$stdout" 2> "$OUT/logs/$name.log"
  else
    (cd "$ROOT" && "$@") > "$stdout" 2> "$OUT/logs/$name.log"
  fi
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" \
    "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')" \
    >> "$OUT/steps.tsv"
  if (( rc != 0 )); then
    FAILED=1
    echo "[acceptance] $name: exit $rc (see $OUT/logs/$name.log)" >&2
  fi
  return 0
}

dry_flag=() dry_verify=()
# the dry run's verify steps leave the document and window cases to the test suite's matrices
# (tests/test_masks_attention.py, tests/test_verify_flash_rule.py): the script is the subject
(( DRY )) && dry_flag=(--dry-run) && dry_verify=(--no-masks)

# 1. doctor, then the plan: device, world size, usable kernels and impls; the sweep's scenario
step doctor 60 "$OUT/doctor.json" "$PY" -m cpbench doctor --json
step plan 60 "$OUT/plan.txt" "$PY" "$HERE/acceptance_summary.py" plan "$OUT" \
  --template "$ROOT/scenarios/gpu-acceptance.toml" \
  --inference-template "$ROOT/scenarios/gpu-inference.toml" ${dry_flag[@]+"${dry_flag[@]}"}
if ! read -r DEVICE WORLD IMPLS KERNELS < "$OUT/plan.txt" || [[ -z "${WORLD:-}" ]]; then
  cat "$OUT/logs/plan.log" >&2
  "$PY" "$HERE/acceptance_summary.py" summary "$OUT" > "$OUT/summary.md" 2>> "$OUT/logs/plan.log"
  exit 2
fi
echo "[acceptance] $DEVICE, world size $WORLD, impls: $IMPLS, kernels: ${KERNELS:-none}" >&2

# 1a. the kernels' ops themselves against float64 (tests/test_cuda_kernels.py), where pytest
# is installed (the `test` extra): causal, full and band pieces, one key, GQA, bf16 and float32
if (( ! DRY )) && "$PY" -c "import pytest" 2> /dev/null; then
  step cuda-kernels 120 "$OUT/cuda-kernels.txt" "$PY" -m pytest -q -n 0 -p no:cacheprovider \
    -p no:randomly tests/test_cuda_kernels.py
fi

# 2. verify in bf16, every case of the world size: cpbench first, then each usable library
for impl in ${IMPLS//,/ }; do
  limit=60
  [[ "$impl" == cpbench ]] && limit=150
  step "verify-${impl//:/_}" "$limit" "$OUT/verify-${impl//:/_}.json" \
    "$PY" -m cpbench verify --device "$DEVICE" --world-size "$WORLD" --dtype bfloat16 \
    --impl "$impl" --json ${dry_verify[@]+"${dry_verify[@]}"}
done
# 2a. the same cases (packed documents, sliding windows among them) with flash-attn 2 forced
# where doctor finds it usable: `auto` prefers FA3 on Hopper, so its window arithmetic (band
# pieces split into the calls its clamping makes exact) would otherwise go unchecked
if "$PY" - "$OUT/doctor.json" 2> /dev/null <<'PY'
import json, sys
kernels = json.load(open(sys.argv[1]))["kernels"]
sys.exit(0 if any(k["name"] == "flash_attn" and k["dtype"] == "bfloat16" and k["usable"]
                  for k in kernels) else 1)
PY
then
  step verify-cpbench_flash_attn 150 "$OUT/verify-cpbench_flash_attn.json" \
    "$PY" -m cpbench verify --device "$DEVICE" --world-size "$WORLD" --dtype bfloat16 \
    --kernel flash_attn --masks --json
fi

# 2b. the inference path with each usable kernel forced: prefill (pass-KV, pass-Q, all-gather,
# Ulysses; contiguous and zigzag new tokens), decode (both cache layouts, both merges), against
# the float64 reference and the byte model; a kernel's refusals (cuDNN's one key, the efficient
# kernel's alignment) are where a CPU run cannot see them
inference_kernels=${KERNELS//,/ }
(( DRY )) && inference_kernels=${inference_kernels%% *}  # the dry run: the first kernel only
for kernel in $inference_kernels; do
  step "verify-inference-$kernel" 60 "$OUT/verify-inference-$kernel.json" \
    "$PY" -m cpbench verify --device "$DEVICE" --world-size "$WORLD" --dtype bfloat16 \
    --kernel "$kernel" --inference --json ${dry_verify[@]+"${dry_verify[@]}"}
done

# 2c. cpbench's own schemes next to each usable library against a single-GPU baseline measured
# in the same run (`cpbench efficiency`: interleaved rounds, best and median, efficiency =
# t_single / (P x t_case)); needs at least 2 ranks
if (( WORLD >= 2 )); then
  eff_args=(--device "$DEVICE" --world-size "$WORLD" --dtype bfloat16 --json
            --out "$OUT/efficiency.json")
  if (( DRY )); then
    eff_args+=(--seq-len 256 --heads 4 --head-dim 16 --rounds 1 --impl cpbench)
  else
    eff_args+=(--seq-len 32768 --heads 16 --head-dim 128 --rounds 3)
    for impl in ${IMPLS//,/ }; do eff_args+=(--impl "$impl"); done
  fi
  step efficiency 90 "$OUT/logs/efficiency.out" "$PY" -m cpbench efficiency "${eff_args[@]}"
fi

# 3. the inference sweep: time to first token per scheme, decode latency and tokens/s
rm -f "$OUT/inference.jsonl" "$OUT/inference.jsonl.inflight"
step sweep-inference 120 "$OUT/logs/sweep-inference.out" "$PY" -m cpbench sweep \
  "$OUT/inference.toml" --out "$OUT/inference.jsonl" --device "$DEVICE" --world-size "$WORLD"

# 4. the training sweep (memory probes in every record), leaving 45 s for the report and summary
left=$(( START + BUDGET - $(date +%s) - 45 ))
rm -f "$OUT/sweep.jsonl" "$OUT/sweep.jsonl.inflight"  # a rerun into the same folder starts afresh
step sweep "$left" "$OUT/logs/sweep.out" "$PY" -m cpbench sweep "$OUT/scenario.toml" \
  --out "$OUT/sweep.jsonl" --device "$DEVICE" --world-size "$WORLD"

# 5. the report of both sweeps, 6. the one-page summary
swept=()
for f in "$OUT/sweep.jsonl" "$OUT/inference.jsonl"; do [[ -s "$f" ]] && swept+=("$f"); done
if (( ${#swept[@]} )); then
  step report 40 "$OUT/report.json" "$PY" -m cpbench report "${swept[@]}" \
    --output "$OUT/report.html" --json
fi
step summary 20 "$OUT/summary.md" "$PY" "$HERE/acceptance_summary.py" summary "$OUT"
cat "$OUT/summary.md"
echo "[acceptance] done in $(( $(date +%s) - START )) s: $OUT" >&2
exit "$FAILED"
