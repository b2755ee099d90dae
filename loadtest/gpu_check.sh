#!/usr/bin/env bash
# On a GPU machine: export the fp16 twin, then time the raw fp16 ceiling and the service on CUDA.
#   bash loadtest/gpu_check.sh            (uses .venv-gpu, made here from the project's own files)
# onnxruntime-gpu and onnxruntime overwrite each other, so the GPU run gets its own environment:
# the export extra (which pulls plain onnxruntime) is used only to write the model, from .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/bert-base-chinese-twin}

make install >/dev/null
[ -f "$MODEL/encoder.fp16.onnx" ] || .venv/bin/python -m loadtest.make_twin --out "$MODEL" --variants fp32,fp16

if [ ! -x .venv-gpu/bin/python ]; then
  python3 -m venv .venv-gpu
  .venv-gpu/bin/pip install -q -e '.[gpu,loadtest]'
  .venv-gpu/bin/pip uninstall -q -y onnxruntime
  .venv-gpu/bin/pip install -q --force-reinstall --no-deps 'onnxruntime-gpu>=1.31,<1.33'
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
.venv-gpu/bin/python -m loadtest.gpu_check --model "$MODEL" "$@"
