#!/usr/bin/env bash
# Issue 52's device run, one command: the fp16 twin export (once), the first-run probe
# (loadtest.first_run), the answer path (loadtest.answer_path), then loadtest.gpu_check (parity, the raw fp16
# ceiling, the service cells and their targets, the 1/2/4/8-worker rows). Each stage is timed against a
# budget (--budget, 480 s: under 8 minutes on an H100 with the defaults); everything lands in $OUT (or
# loadtest/results/gpu-check-<time>/): gpu-check.json (every stage's figures), gpu-check.md (the tables),
# first-run.json, answer-path.json and the service logs. Exits 1 when a stage failed.
#
#   bash loadtest/gpu_check.sh [--provider P] [--budget S] [--shape-grid V] [--cuda-graphs V] [GPU_CHECK_ARGS]
#
# GPU_CHECK_ARGS go to python -m loadtest.gpu_check (after this script's defaults, so they win).
# --provider CPUExecutionProvider runs every stage on this machine's CPU with small sizes (8 clients, 1.5 s
# windows, 1 and 2 workers) on the tiny model (exported into build/gpu-check-tiny unless MODEL is set): the
# script is tested where there is no GPU; its figures mean nothing.
#
# On the offline CUDA 13 host, from the project root, with the uploads that ../shared/gpu/pack.sh makes:
#   bash .gpu/k1/stash.sh; ...; bash .gpu/k4/stash.sh        (one per upload, as each arrives)
#   source .gpu/k4/env.sh && bash loadtest/gpu_check.sh
# env.sh puts onnxruntime-gpu and the service's wheels on PYTHONPATH for the host's own python3 (3.12,
# with torch and onnx for the export): python3 then runs everything, no venv.
# Elsewhere (a GPU host with network): .venv (`make install`) exports, and .venv-gpu runs the check, since
# onnxruntime-gpu and the export extra's plain onnxruntime overwrite each other in one environment.
set -euo pipefail
cd "$(dirname "$0")/.."
PROVIDER=CUDAExecutionProvider BUDGET=480 SETTINGS=() REST=()
while [ $# -gt 0 ]; do
  case "$1" in
    --provider) PROVIDER=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    # The shape grid and CUDA graphs (issue 52; settings shape_grid, cuda_graphs), passed to every service
    # start as ZHEMBED_*; other settings through --setting NAME=VALUE (a name the service lacks is refused).
    --shape-grid) SETTINGS+=(--setting "shape_grid=$2"); shift 2 ;;
    --cuda-graphs) SETTINGS+=(--setting "cuda_graphs=$2"); shift 2 ;;
    *) REST+=("$1"); shift ;;
  esac
done
STASH=/tmp/zhembed-gpu
DIR=${OUT:-loadtest/results/gpu-check-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$DIR"

if [ "$PROVIDER" != CUDAExecutionProvider ]; then
  [ -x .venv/bin/python ] || make install >/dev/null
  EXPORT_PY=.venv/bin/python PY=.venv/bin/python
  MODEL=${MODEL:-build/gpu-check-tiny}
  # small sizes: the CPU shows that every stage runs, not how fast a GPU is
  CHECK=(--clients 8 --seconds 1.5 --warmup 0.5 --raw-seconds 0.1 --workers 1,2 --worker-cells x32)
  PROBE=(--shapes 1x8,4x16,8x32) ANSWER=(--seconds 1 --width 768)
elif [[ ":${PYTHONPATH:-}:" == *":$STASH/site:"* ]]; then
  EXPORT_PY=python3 PY=python3
  CHECK=() PROBE=() ANSWER=(--seconds 3)
else
  make install >/dev/null
  EXPORT_PY=.venv/bin/python PY=.venv-gpu/bin/python
  if [ ! -x .venv-gpu/bin/python ]; then
    python3 -m venv .venv-gpu
    .venv-gpu/bin/pip install -q -e '.[gpu,loadtest]'
    .venv-gpu/bin/pip uninstall -q -y onnxruntime
    .venv-gpu/bin/pip install -q --force-reinstall --no-deps 'onnxruntime-gpu>=1.31,<1.33'
  fi
  CHECK=() PROBE=() ANSWER=(--seconds 3)
fi
MODEL=${MODEL:-models/bert-base-chinese-twin}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

status=0 STAGES=() last=$SECONDS
stage() {  # NAME: record the seconds since the last stage ended
  STAGES+=("\"$1\": $((SECONDS - last))"); echo "== $1: $((SECONDS - last)) s (total ${SECONDS} s of ${BUDGET} s)"
  last=$SECONDS
}
if [ ! -f "$MODEL/encoder.fp16.onnx" ]; then
  if [ "$PROVIDER" != CUDAExecutionProvider ]; then
    $EXPORT_PY -c "from pathlib import Path; from loadtest.quick_model import export_tiny
export_tiny(Path('$MODEL-source'), Path('$MODEL'), ('fp32', 'fp16'), 2)"
  else
    $EXPORT_PY -m loadtest.make_twin --out "$MODEL" --variants fp32,fp16
  fi
fi
stage export
$PY -m loadtest.first_run --model "$MODEL" --provider "$PROVIDER" --out "$DIR/first-run.json" "${PROBE[@]}" || status=1
stage first_run
$PY -m loadtest.answer_path --model "$MODEL" --variant fp16 --provider "$PROVIDER" --out "$DIR/answer-path.json" \
  "${ANSWER[@]}" || status=1
stage answer_path
(IFS=,; echo "{${STAGES[*]}}") >"$DIR/stages.json"
$PY -m loadtest.gpu_check --model "$MODEL" --provider "$PROVIDER" --out "$DIR/gpu-check.json" \
  --markdown "$DIR/gpu-check.md" --budget-s $((BUDGET - SECONDS > 60 ? BUDGET - SECONDS : 60)) \
  --attach first_run="$DIR/first-run.json" --attach answer_path="$DIR/answer-path.json" \
  --attach stages="$DIR/stages.json" "${CHECK[@]}" "${SETTINGS[@]}" "${REST[@]}" || status=$?
stage gpu_check

cp -f loadtest/results/logs/gpu-service-*.log "$DIR"/ 2>/dev/null || true
verdict=$([ "$SECONDS" -le "$BUDGET" ] && echo within || echo OVER)
echo "gpu_check.sh: ${SECONDS} s, ${verdict} the budget of ${BUDGET} s ($(IFS=,; echo "${STAGES[*]}" | tr -d '"' | sed 's/,/, /g'))"
if compgen -G "$STASH/parts/part*" >/dev/null; then
  first=$(stat -c %Y "$STASH"/parts/part* | sort -n | head -1)
  echo "since the first upload was stashed: $(($(date +%s) - first)) s"
fi
echo "report: $DIR/gpu-check.json, $DIR/gpu-check.md"
exit $status
