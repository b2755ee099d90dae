"""The export pipeline: manifest, files, graph contracts, parity, atomicity and no-op re-runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from app.model.manifest import (
    ANY_CPU,
    MANIFEST_NAME,
    VARIANTS,
    VNNI,
    load_manifest,
    reexport_command,
    sha256_file,
    verify_files,
)
from app.model.runtime import cpu_has_vnni
from export import graphs, variants
from export.pipeline import ExportOptions, run_export
from export.source import ExportError
from export.spec import THRESHOLDS, Threshold
from export.validate import ValidationFailedError
from tests.conftest import MATRYOSHKA_DIMENSIONS, TINY_CONFIG


def _quiet(_line: str) -> None:
    pass


def test_manifest_records_source_config_and_versions(tiny_model_dir: Path) -> None:
    manifest = load_manifest(tiny_model_dir)
    assert manifest.source.weights == "pretrained"
    assert manifest.source.local is True
    assert manifest.source.weights_sha256 is not None and len(manifest.source.weights_sha256) == 64
    assert manifest.config.num_layers == TINY_CONFIG["num_hidden_layers"]
    assert manifest.config.hidden_size == TINY_CONFIG["hidden_size"]
    assert manifest.config.vocab_size == 21128
    assert manifest.config.has_pooler and manifest.config.has_mlm_head
    assert manifest.variants == list(VARIANTS)
    for name in ("torch", "transformers", "optimum", "onnx", "onnxruntime"):
        assert manifest.versions[name] != "absent"
    assert manifest.timings_s["export encoder fp32"] > 0


def test_every_file_matches_its_recorded_hash_and_size(tiny_model_dir: Path) -> None:
    manifest = load_manifest(tiny_model_dir)
    for per_variant in manifest.graphs.values():
        for graph in per_variant.values():
            path = tiny_model_dir / graph.file
            assert sha256_file(path) == graph.sha256
            assert path.stat().st_size == graph.bytes
    verify_files(tiny_model_dir, manifest.tokenizer.files)
    assert "tokenizer.json" in manifest.tokenizer.files


def test_encoder_graph_inputs_and_outputs_match_the_manifest(tiny_model_dir: Path) -> None:
    manifest = load_manifest(tiny_model_dir)
    layers = manifest.config.num_layers
    for variant, graph in manifest.graphs["encoder"].items():
        model = onnx.load(str(tiny_model_dir / graph.file), load_external_data=False)
        inputs = {i.name: i.type.tensor_type for i in model.graph.input}
        outputs = {o.name: o.type.tensor_type for o in model.graph.output}
        assert list(inputs) == ["input_ids", "attention_mask", "token_type_ids"], variant
        assert all(t.elem_type == onnx.TensorProto.INT64 for t in inputs.values())
        pooled = [f"{mode}_{i}" for mode in ("cls", "mean") for i in range(1, layers + 1)]
        expected = [f"hidden_state_{i}" for i in range(1, layers)] + ["last_hidden_state", "pooler_output"]
        assert list(outputs) == expected + pooled, variant
        # fp16 keeps fp32 inputs/outputs: the service never converts.
        assert all(t.elem_type == onnx.TensorProto.FLOAT for t in outputs.values()), variant
        assert [s.name for s in graph.outputs] == expected + pooled
        for spec in graph.outputs:
            width = ["batch", "sequence"] if spec.name in expected[:layers] else ["batch"]
            assert spec.shape == [*width, manifest.config.hidden_size], spec
        dims = [d.dim_param for d in inputs["input_ids"].shape.dim]
        assert dims == ["batch", "sequence"]
    assert manifest.layer_outputs[layers] == "last_hidden_state"
    assert manifest.layer_outputs[1] == "hidden_state_1"


def test_manifest_declares_each_layers_pooled_outputs(tiny_model_dir: Path) -> None:
    manifest = load_manifest(tiny_model_dir)
    layers = range(1, manifest.config.num_layers + 1)
    assert manifest.pooled_outputs == {
        "cls": {i: f"cls_{i}" for i in layers},
        "mean": {i: f"mean_{i}" for i in layers},
    }
    for graph in manifest.graphs["encoder"].values():
        declared = {s.name for s in graph.outputs}
        assert all(n in declared for per in manifest.pooled_outputs.values() for n in per.values())


def test_mlm_head_is_a_small_graph_from_hidden_to_vocab(tiny_model_dir: Path) -> None:
    manifest = load_manifest(tiny_model_dir)
    for graph in manifest.graphs["mlm_head"].values():
        model = onnx.load(str(tiny_model_dir / graph.file))
        (inp,) = model.graph.input
        (out,) = model.graph.output
        assert inp.name == "hidden" and out.name == "logits"
        assert [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim] == ["k", 21128]


def test_int8_has_integer_weights_and_fp16_half_weights(tiny_model_dir: Path) -> None:
    manifest = load_manifest(tiny_model_dir)
    int8 = onnx.load(str(tiny_model_dir / manifest.graphs["encoder"]["int8"].file))
    assert any(init.data_type == onnx.TensorProto.INT8 for init in int8.graph.initializer)
    assert manifest.graphs["encoder"]["int8"].recipe["weight_type"] == "QInt8"
    # The CPU the int8 graph is for, and its activation levels, as this machine's CPU chose them.
    for graph in manifest.graphs.values():
        recipe = graph["int8"].recipe
        assert recipe["cpu"] == (VNNI if cpu_has_vnni() else ANY_CPU) == graph["int8"].cpu
        assert recipe["act_levels"] == (256 if cpu_has_vnni() else 128)
    fp16 = onnx.load(str(tiny_model_dir / manifest.graphs["encoder"]["fp16"].file))
    assert any(init.data_type == onnx.TensorProto.FLOAT16 for init in fp16.graph.initializer)
    assert manifest.graphs["encoder"]["fp16"].provider == "CUDAExecutionProvider"


def test_every_variant_passed_parity_within_its_thresholds(tiny_model_dir: Path) -> None:
    manifest = load_manifest(tiny_model_dir)
    for variant in VARIANTS:
        result = manifest.validation[variant]
        assert result.passed and result.sentences >= 32
        for t in THRESHOLDS[variant]:
            if t.metric.startswith(
                ("sentence_", "head_", "sparse_")
            ):  # only with a Dense, a head, a sparse graph
                assert t.metric not in result.metrics
                continue
            metric = result.metrics[t.metric]
            assert metric.enforced and metric.passed and metric.threshold == t.value
    fp32 = manifest.validation["fp32"].metrics
    assert fp32["cosine_min"].value >= 0.99999
    assert fp32["mlm_top1"].value == 1.0
    assert fp32["max_abs_diff"].value < 1e-4


def test_every_pooled_output_is_validated_on_its_own(tiny_model_dir: Path) -> None:
    manifest = load_manifest(tiny_model_dir)
    names = [n for per in manifest.pooled_outputs.values() for n in per.values()]
    for variant in VARIANTS:
        metrics = manifest.validation[variant].metrics
        total = metrics["cosine_min"]
        for name in names:
            metric = metrics[f"cosine_min/{name}"]
            assert metric.threshold == total.threshold and metric.enforced == total.enforced, name
            assert metric.passed and metric.value >= total.value, name


def test_rerun_with_same_source_and_options_is_a_noop(tiny_source_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "model"
    options = ExportOptions(out=out, model=str(tiny_source_dir), variants=("fp32",))
    first = run_export(options, log=_quiet)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    lines: list[str] = []
    again = run_export(options, log=lines.append)
    assert again == first
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    assert any("up to date" in line for line in lines)
    forced = run_export(
        ExportOptions(out=out, model=str(tiny_source_dir), variants=("fp32",), force=True), _quiet
    )
    assert forced.created_at >= first.created_at
    assert (out / "manifest.json").stat().st_mtime_ns != stamp


def test_other_options_are_not_a_noop(tiny_source_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "model"
    first = run_export(ExportOptions(out=out, model=str(tiny_source_dir), variants=("fp32",)), _quiet)
    second = run_export(ExportOptions(out=out, model=str(tiny_source_dir), variants=("fp32", "int8")), _quiet)
    assert first.source.fingerprint != second.source.fingerprint
    assert second.variants == ["fp32", "int8"]


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (the service's batch_costs/ cache beside the export too) by its digest."""
    return {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_failed_validation_lists_every_miss_and_leaves_out_untouched(
    tiny_model_dir: Path, tiny_source_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "model"
    shutil.copytree(tiny_model_dir, out)
    before = _snapshot(out)
    impossible = dict(THRESHOLDS)
    impossible["fp32"] = (Threshold("cosine_min", ">=", 1.5), Threshold("max_abs_diff", "<=", -1.0))
    options = ExportOptions(out=out, model=str(tiny_source_dir), variants=("fp32",), force=True)
    with pytest.raises(ValidationFailedError) as failure:
        run_export(options, log=_quiet, thresholds=impossible)
    assert "fp32 cosine_min" in str(failure.value) and "fp32 max_abs_diff" in str(failure.value)
    assert _snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_tampered_graph_fails_validation(
    tiny_source_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_to_int8 = variants.to_int8

    def tampered(src: Path, dst: Path, *args: object, **kwargs: object) -> dict[str, str | bool | int]:
        recipe = real_to_int8(src, dst, *args, **kwargs)  # type: ignore[arg-type]
        model = onnx.load(str(dst))
        for init in model.graph.initializer:
            if init.data_type == onnx.TensorProto.INT8 and len(init.raw_data) > 1000:
                init.raw_data = bytes(reversed(init.raw_data))
        onnx.save(model, str(dst))
        return recipe

    monkeypatch.setattr(variants, "to_int8", tampered)
    out = tmp_path / "model"
    with pytest.raises(ValidationFailedError, match="int8 cosine_min"):
        run_export(ExportOptions(out=out, model=str(tiny_source_dir), variants=("fp32", "int8")), _quiet)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_wrong_pooled_output_fails_validation_naming_each_one(
    tiny_source_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two layers' means swapped in the graph (a mislabelled output): both are listed, by name."""
    real_export = graphs.export_encoder

    def swapped(loaded: object, path: Path, opset: int, all_layers: bool = True, **kwargs: object) -> None:
        real_export(loaded, path, opset, all_layers, **kwargs)  # type: ignore[arg-type]
        model = onnx.load(str(path))
        rename = {"mean_2": "mean_3", "mean_3": "mean_2"}
        for node in model.graph.node:
            node.output[:] = [rename.get(o, o) for o in node.output]
        onnx.save(model, str(path))

    monkeypatch.setattr(graphs, "export_encoder", swapped)
    with pytest.raises(ValidationFailedError) as failure:
        run_export(
            ExportOptions(out=tmp_path / "model", model=str(tiny_source_dir), variants=("fp32",)), _quiet
        )
    message = str(failure.value)
    assert "fp32 cosine_min/mean_2" in message and "fp32 cosine_min/mean_3" in message
    assert "fp32 max_abs_diff" in message
    assert "mean_1" not in message and "cls_" not in message
    assert list(tmp_path.iterdir()) == []


def test_an_exception_mid_export_leaves_no_partial_folder(
    tiny_source_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(graphs, "export_mlm_head", boom)
    with pytest.raises(KeyboardInterrupt):
        run_export(ExportOptions(out=tmp_path / "model", model=str(tiny_source_dir)), _quiet)
    assert list(tmp_path.iterdir()) == []


def test_manifest_is_plain_json_the_service_can_read(tiny_model_dir: Path) -> None:
    raw = json.loads((tiny_model_dir / "manifest.json").read_text())
    assert raw["schema_version"] == 3
    assert raw["pooled_outputs"]["mean"]["1"] == "mean_1"  # JSON keys are strings; the model reads ints
    assert set(raw["graphs"]) == {"encoder", "mlm_head"}


def test_a_config_that_declares_matryoshka_training_is_recorded(
    matryoshka_model_dir: Path, tiny_model_dir: Path
) -> None:
    declared = load_manifest(matryoshka_model_dir).defaults
    assert declared.matryoshka is True
    assert declared.matryoshka_dimensions == sorted(MATRYOSHKA_DIMENSIONS, reverse=True)
    plain = load_manifest(tiny_model_dir).defaults
    assert plain.matryoshka is False and plain.matryoshka_dimensions is None


def test_the_flag_declares_matryoshka_and_only_then_enters_the_fingerprint(
    tiny_source_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "model"
    plain = ExportOptions(out=out, model=str(tiny_source_dir), variants=("fp32",))
    assert "matryoshka" not in plain.fingerprint_fields()  # every export made before keeps its fingerprint
    first = run_export(plain, log=_quiet)
    flagged = run_export(
        ExportOptions(out=out, model=str(tiny_source_dir), variants=("fp32",), matryoshka_dimensions="any"),
        _quiet,
    )
    assert first.source.fingerprint != flagged.source.fingerprint
    assert flagged.defaults.matryoshka is True and flagged.defaults.matryoshka_dimensions is None
    raw = json.loads((out / MANIFEST_NAME).read_text())
    assert reexport_command(out, raw).endswith("--matryoshka-dimensions any --force")


def test_an_export_that_predates_the_matryoshka_fields_is_exported_again(
    matryoshka_model_dir: Path, tmp_path: Path
) -> None:
    # A manifest written before the fields existed, of a source whose config declares the training: the
    # fingerprint (over the same config.json) matches, the manifest reads as untrained.
    out = tmp_path / "model"
    shutil.copytree(matryoshka_model_dir, out)
    raw = json.loads((out / MANIFEST_NAME).read_text())
    del raw["defaults"]["matryoshka"], raw["defaults"]["matryoshka_dimensions"]
    (out / MANIFEST_NAME).write_text(json.dumps(raw))
    assert load_manifest(out).defaults.matryoshka is False  # read without a schema bump
    lines: list[str] = []
    again = run_export(ExportOptions(out=out, model=raw["source"]["model"], variants=("fp32",)), lines.append)
    assert not any("up to date" in line for line in lines)
    assert again.defaults.matryoshka_dimensions == sorted(MATRYOSHKA_DIMENSIONS, reverse=True)


def test_matryoshka_widths_the_vectors_do_not_have_are_refused_before_any_graph(
    tiny_source_dir: Path, tmp_path: Path
) -> None:
    lines: list[str] = []
    with pytest.raises(ExportError, match=r"\[128\] do not fit this model's vectors of 64 dimensions"):
        run_export(
            ExportOptions(
                out=tmp_path / "m",
                model=str(tiny_source_dir),
                variants=("fp32",),
                matryoshka_dimensions=(128, 32),
            ),
            lines.append,
        )
    assert not any("export encoder" in line for line in lines)
