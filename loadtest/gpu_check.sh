#!/usr/bin/env bash
# On a GPU machine: export the fp16 twin (once), then run python -m loadtest.gpu_check (parity, the raw
# fp16 ceiling, issue 13's service table and targets); arguments go to it. Prints how long it all took.
#
# On the offline CUDA 13 host, from the project root, with the uploads that ../shared/gpu/pack.sh makes:
#   bash .gpu/k1/stash.sh; ...; bash .gpu/k4/stash.sh        (one per upload, as each arrives)
#   source .gpu/k4/env.sh && bash loadtest/gpu_check.sh
# env.sh puts onnxruntime-gpu and the service's wheels on PYTHONPATH for the host's own python3 (3.12,
# with torch and onnx for the export): python3 then runs everything, no venv.
# Elsewhere (a GPU host with network): .venv (`make install`) exports, and .venv-gpu runs the check, since
# onnxruntime-gpu and the export extra's plain onnxruntime overwrite each other in one environment.
# With OUT set to a folder, the JSON report and the service logs are copied there.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/bert-base-chinese-twin}
STASH=/tmp/zhembed-gpu

if [[ ":${PYTHONPATH:-}:" == *":$STASH/site:"* ]]; then
  EXPORT_PY=python3 PY=python3
else
  make install >/dev/null
  EXPORT_PY=.venv/bin/python PY=.venv-gpu/bin/python
  if [ ! -x .venv-gpu/bin/python ]; then
    python3 -m venv .venv-gpu
    .venv-gpu/bin/pip install -q -e '.[gpu,loadtest]'
    .venv-gpu/bin/pip uninstall -q -y onnxruntime
    .venv-gpu/bin/pip install -q --force-reinstall --no-deps 'onnxruntime-gpu>=1.31,<1.33'
  fi
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

[ -f "$MODEL/encoder.fp16.onnx" ] || $EXPORT_PY -m loadtest.make_twin --out "$MODEL" --variants fp32,fp16
exported=$SECONDS
JSON=loadtest/results/gpu-check-$(date +%Y%m%d-%H%M%S).json
status=0
$PY -m loadtest.gpu_check --model "$MODEL" --out "$JSON" "$@" || status=$?

echo "gpu_check.sh: ${SECONDS} s (set-up and twin export ${exported} s, check $((SECONDS - exported)) s)"
if compgen -G "$STASH/parts/part*" >/dev/null; then
  first=$(stat -c %Y "$STASH"/parts/part* | sort -n | head -1)
  echo "since the first upload was stashed: $(($(date +%s) - first)) s"
fi
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp -f "$JSON" loadtest/results/logs/gpu-service-*.log "$OUT"/ 2>/dev/null || true
fi
exit $status
