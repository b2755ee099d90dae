# syntax=docker/dockerfile:1.7
#
# zhembed images. Targets:
#   runtime-gpu (default, last stage)  CUDA 13 + cuDNN 9 + onnxruntime-gpu; serves fp16 on CUDA
#   runtime-cpu                        python slim + onnxruntime; serves int8
#   exporter                           torch (CPU) + the export extra; writes the validated model folder
#
#   docker build -t zhembed:gpu .
#   docker build -t zhembed:cpu --target runtime-cpu .
#   docker build -t zhembed:cpu --target runtime-cpu --build-arg MODEL_ID=org/model --build-arg MODEL_REVISION=SHA .
#   docker build -t zhembed:0.1.0-cpu-ray --target runtime-cpu --build-arg EXTRAS=ray .   # the bulk job on Ray
#   # a local checkpoint (or an already exported folder holding manifest.json), no hub access needed:
#   docker build -t zhembed:cpu --target runtime-cpu --build-context model-source=/path/to/folder .
#   # (then run it with ZHEMBED_SERVED_MODEL_NAME=bert-base-chinese: clients are told the source folder's
#   # name otherwise, which in the image is "model-source")
#
# Neither runtime image holds torch: the service only needs ONNX Runtime and tokenizers.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# onnxruntime-gpu 1.31+ on PyPI is built against CUDA 13 and cuDNN 9 (its `cuda` extra asks for
# nvidia-cuda-runtime~=13.0 and nvidia-cudnn-cu13); the host needs an NVIDIA driver >= 580.
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04

# --- model-source: empty unless the operator passes --build-context model-source=DIR ------------------
FROM scratch AS model-source

# --- wheel: the project as a wheel, plus requirement lists read from pyproject.toml -------------------
FROM ${PYTHON_IMAGE} AS wheel
# Extras the runtime images also install, e.g. EXTRAS=ray for the bulk job on Ray (deploy/bulk).
ARG EXTRAS=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY export ./export
# requirements-gpu.txt: the service's dependencies with onnxruntime swapped for the `gpu` extra. Both
# packages install into the same `onnxruntime/` folder, so one must never be installed over the other.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && python - <<'EOF'
import os, re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
def expand(name):  # an extra's requirements, with ours (zhembed[bulk]) spelt out
    for req in extras[name]:
        ours = re.fullmatch(r"zhembed\[([\w,-]+)\]", req)
        yield from (r for n in ours.group(1).split(",") for r in expand(n)) if ours else [req]
deps = project["dependencies"] + [r for name in os.environ.get("EXTRAS", "").split(",") if name for r in expand(name)]
is_ort = lambda req: re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower() == "onnxruntime"
open("/wheels/requirements-cpu.txt", "w").write("\n".join(deps) + "\n")
gpu = [d for d in deps if not is_ort(d)] + extras["gpu"]
open("/wheels/requirements-gpu.txt", "w").write("\n".join(gpu) + "\n")
EOF

# --- exporter: checkpoint -> validated ONNX graphs + manifest.json in /model ---------------------------
FROM ${PYTHON_IMAGE} AS exporter
ARG MODEL_ID=bert-base-chinese
ARG MODEL_REVISION=
# fp16 for runtime-gpu, int8 for runtime-cpu; fp32 is the reference and only adds size to the image.
ARG EXPORT_VARIANTS=fp16,int8
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 \
    HF_HOME=/tmp/hf
# torch from the CPU index first: the export extra pins torch==2.13.0, which 2.13.0+cpu satisfies, and
# PyPI's default build of it drags in several GB of CUDA libraries that an export never uses.
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/zhembed-*.whl)[export]"
COPY --from=model-source / /model-source/
# A folder that already holds manifest.json was exported before: keep it as it is (the service checks
# every file's sha256 at start-up). Anything else is exported and validated against PyTorch here.
RUN set -eu; \
    model="$MODEL_ID"; \
    if [ -f /model-source/config.json ]; then model=/model-source; fi; \
    if [ -f /model-source/manifest.json ]; then \
      cp -a /model-source /model; \
    else \
      python -m export --model "$model" ${MODEL_REVISION:+--revision "$MODEL_REVISION"} \
        --variants "$EXPORT_VARIANTS" --out /model; \
    fi; \
    rm -rf /tmp/hf; \
    python -c "import json; m = json.load(open('/model/manifest.json')); print('exported', m['source']['model'], sorted(m['graphs']['encoder']))"

# --- runtime-cpu -----------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime-cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install --no-cache-dir -r /wheels/requirements-cpu.txt \
 && pip install --no-cache-dir --no-deps /wheels/zhembed-*.whl \
 && useradd --system --uid 10001 --user-group --no-create-home --home-dir /tmp zhembed
COPY --from=exporter --chown=root:root /model /models/zhembed
ENV ZHEMBED_MODEL=/models/zhembed \
    ZHEMBED_CACHE_DIR=/tmp/zhembed \
    ZHEMBED_HOST=0.0.0.0 \
    ZHEMBED_PORT=8080 \
    HOME=/tmp
USER 10001:10001
WORKDIR /tmp
# 8080 HTTP; 50051 gRPC when ZHEMBED_GRPC_PORT=50051 is set (off by default).
EXPOSE 8080 50051
# Liveness only: readiness (/ready) is for load balancers. A python one-liner, so no curl in the image.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('ZHEMBED_PORT', '8080') + '/health', timeout=4)"]
CMD ["python", "-m", "app"]

# --- runtime-gpu (default target: keep it last) ----------------------------------------------------------
FROM ${CUDA_IMAGE} AS runtime-gpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    DEBIAN_FRONTEND=noninteractive \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
# Ubuntu's python3 is fixed by the pinned CUDA base; apt versions pinned here would break the build on
# every security update of the archive.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install --no-cache-dir -r /wheels/requirements-gpu.txt \
 && pip install --no-cache-dir --no-deps /wheels/zhembed-*.whl \
 && python -c "import importlib.metadata as m; assert m.version('onnxruntime-gpu'); import onnxruntime as o; assert 'CUDAExecutionProvider' in o.get_available_providers(), o.get_available_providers()" \
 && useradd --system --uid 10001 --user-group --no-create-home --home-dir /tmp zhembed
COPY --from=exporter --chown=root:root /model /models/zhembed
ENV ZHEMBED_MODEL=/models/zhembed \
    ZHEMBED_CACHE_DIR=/tmp/zhembed \
    ZHEMBED_HOST=0.0.0.0 \
    ZHEMBED_PORT=8080 \
    HOME=/tmp \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /tmp
# 8080 HTTP; 50051 gRPC when ZHEMBED_GRPC_PORT=50051 is set (off by default).
EXPOSE 8080 50051
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('ZHEMBED_PORT', '8080') + '/health', timeout=4)"]
CMD ["python", "-m", "app"]
