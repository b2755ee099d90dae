"""deploy/bulk/rayjob.yaml: valid against the parts of KubeRay's RayJob schema it uses (written down in
deploy/bulk/rayjob.schema.json), and the job it runs is one the bulk job's flags accept, sized to its pods.
(.ci/check-deploy.sh checks the kustomized output too, and its pod templates with kubernetes-validate.)"""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from app.bulk.cli import parser

BULK = Path(__file__).resolve().parents[3] / "deploy" / "bulk"


def rayjob() -> dict[str, Any]:
    return yaml.safe_load((BULK / "rayjob.yaml").read_text())


def validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((BULK / "rayjob.schema.json").read_text()))


def test_the_rayjob_fits_kuberays_schema_and_a_misspelt_field_does_not() -> None:
    job = rayjob()
    validator().validate(job)
    for path, bad in (
        (("spec",), {"entrypont": "x"}),  # a typo the API server would silently drop
        (("spec", "rayClusterSpec", "workerGroupSpecs", 0), {"replicas": "4"}),
        (("spec", "rayClusterSpec", "headGroupSpec", "rayStartParams"), {"num-cpus": 0}),
        (("spec",), {"submissionMode": "K8sMode"}),
    ):
        broken = copy.deepcopy(job)
        node: Any = broken
        for key in path:
            node = node[key]
        node.update(bad)
        with pytest.raises(jsonschema.ValidationError):
            validator().validate(broken)


def test_the_entrypoint_is_a_bulk_command_sized_to_the_worker_pods() -> None:
    job = rayjob()
    words = shlex.split(job["spec"]["entrypoint"])
    assert words[:3] == ["python", "-m", "app.bulk"]
    args = parser().parse_args(words[3:])
    (workers,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    (container,) = workers["template"]["spec"]["containers"]
    assert args.ray == "auto" and args.ray_actors == workers["replicas"] == workers["maxReplicas"]
    assert float(container["resources"]["requests"]["cpu"]) >= args.ray_cpus
    # No Service's ZHEMBED_* links in any pod: the settings would read them as their own.
    heads = job["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert heads["template"]["spec"]["enableServiceLinks"] is False
    assert workers["template"]["spec"]["enableServiceLinks"] is False
