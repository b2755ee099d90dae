"""The sparse (SPLADE) graph: its arithmetic, its export and validation, sentence-transformers' SparseEncoder
folders, and what is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import numpy as np
import onnxruntime as ort
import pytest
import torch

from app.model.manifest import LAST_HIDDEN_STATE, SPARSE_OUTPUT, Sparse, Variant, load_manifest
from export import graphs, sentence
from export.pipeline import ExportOptions, run_export
from export.source import ExportError
from export.validate import SPARSE_RELATIVE_FLOOR, SPARSE_RTOL, sparse_agreement, torch_splade
from tests.conftest import TINY_CONFIG

TEXTS = [
    "你好",
    "今天天气很好，我们去公园散步吧。",
    "北京是中华人民共和国的首都，有三千多年的建城史。",
    "这家餐厅的菜很好吃，服务也很周到，下次还会再来。",
    "机器学习",
]


def _quiet(_line: str) -> None:
    pass


def test_log1p_keeps_float32_precision_where_log_of_1_plus_x_does_not() -> None:
    x = torch.tensor([0.0, 1e-9, 3e-7, 1e-4, 0.01, 0.5, 1.0, 7.0, 1e4], dtype=torch.float32)
    want = torch.log1p(x.double())
    got = graphs.log1p(x).double()
    rel = ((got - want).abs() / want.clamp(min=1e-30))[1:]
    assert float(rel.max()) < 1e-6 and float(got[0]) == 0.0
    naive = torch.log(1.0 + x).double()
    assert float(((naive - want).abs() / want.clamp(min=1e-30))[1:4].max()) > 1e-4  # what Kahan's form fixes


def bert_head() -> torch.nn.Module:
    """BERT's masked-LM head (transform, then the vocab projection with its bias), small and random."""
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLMPredictionHead

    head = BertLMPredictionHead(BertConfig(hidden_size=8, vocab_size=50, intermediate_size=16))
    torch.nn.init.normal_(head.bias)  # a bias of zeros would hide one moved to the wrong side of the max
    return head.eval()


@pytest.mark.parametrize("pooling", ["max", "sum"])
@pytest.mark.parametrize("activation", ["relu", "log1p_relu"])
@pytest.mark.parametrize("kind", ["linear", "bert"])
def test_the_graphs_module_computes_what_splade_pooling_does(
    pooling: str, activation: str, kind: str
) -> None:
    """Max pooling pools the logits before the activation and the bias, and fills padded positions with a
    real token's state: the same numbers as activating every token's logits."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50) if kind == "linear" else bert_head()
    hidden = torch.randn(3, 6, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    sparse = Sparse(pooling=pooling, activation=activation)  # type: ignore[arg-type]
    with torch.no_grad():
        got = graphs._Splade(head, sparse)(hidden, mask)
        want = torch_splade(head(hidden), mask, sparse)
    assert got.shape == (3, 50) and bool((got >= 0).all()) and bool((got == 0).any())
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    # A padded position changes nothing: its logits are masked out.
    with torch.no_grad():
        moved = graphs._Splade(head, sparse)(hidden + (1 - mask).unsqueeze(-1) * 5.0, mask)
    torch.testing.assert_close(moved, got, rtol=1e-6, atol=1e-7)


def test_agreement_holds_a_weight_to_1e_4_of_itself_or_of_1_percent_of_the_largest() -> None:
    want = np.array([[2.0, 1.0, 0.1, 1e-4, 0.0, 0.0]])
    # 5e-5 of 1.0; 1e-6 on a weight of 1e-4 (a hundredth of it, but 5e-5 of 1% of the largest); an index
    # one side has (1e-6, 5e-7 of the largest): what float32 leaves of a logit near 0.
    got = np.array([[2.0, 1.00005, 0.1, 1e-4 + 1e-6, 1e-6, 0.0]])
    agreement = sparse_agreement(got, want)
    assert agreement["max_rel_diff"] == pytest.approx(5e-5, rel=1e-3)
    assert agreement["max_rel_diff_above_1e-3"] == pytest.approx(5e-5, rel=1e-3)
    assert agreement["rtol_floor_of_max"] == pytest.approx(1e-4 / 2.0)  # only the weight of 1e-4 is off
    assert agreement["index_mismatches"] == 1 and agreement["same_nonzero_share"] == 0
    assert agreement["mismatch_weight_of_max"] == pytest.approx(5e-7)
    assert agreement["max_diff_of_max"] == pytest.approx(2.5e-5, rel=1e-3)
    # Under 1% of the largest, a weight is held to 1e-4 of that 1% (2e-6 here): 3e-6 off fails.
    worse = sparse_agreement(np.array([[2.0, 1.0, 0.1, 1e-4 + 3e-6]]), want[:, :4])
    assert worse["max_rel_diff"] == pytest.approx(1.5e-4, rel=1e-3)


@pytest.fixture()
def sparse_export(tiny_sparse_dir: Path) -> Path:
    return tiny_sparse_dir


def _splade_of(model: Path, variant: Variant, texts: list[str]) -> np.ndarray:
    """The export's sparse vectors of ``texts``: the encoder's last hidden state through the sparse graph."""
    from tokenizers import Tokenizer

    manifest = load_manifest(model)
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=manifest.tokenizer.pad_id)
    enc = tokenizer.encode_batch(texts)
    ids = np.array([e.ids for e in enc], np.int64)
    mask = np.array([e.attention_mask for e in enc], np.int64)
    encoder = ort.InferenceSession(str(model / manifest.graphs["encoder"][variant].file))
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    (hidden,) = encoder.run([LAST_HIDDEN_STATE], feed)
    splade = ort.InferenceSession(str(model / manifest.graphs["sparse"][variant].file))
    return np.asarray(splade.run([SPARSE_OUTPUT], {LAST_HIDDEN_STATE: hidden, "attention_mask": mask})[0])


def test_the_flag_adds_a_validated_sparse_graph_per_variant(sparse_export: Path) -> None:
    manifest = load_manifest(sparse_export)
    assert manifest.sparse == Sparse(pooling="max", activation="relu")
    assert sorted(manifest.graphs["sparse"]) == ["fp32", "int8"]
    spec = manifest.graphs["sparse"]["fp32"]
    assert [s.name for s in spec.inputs] == [LAST_HIDDEN_STATE, "attention_mask"]
    assert [(s.name, s.shape) for s in spec.outputs] == [(SPARSE_OUTPUT, ["batch", 21128])]
    fp32 = manifest.validation["fp32"].metrics
    assert fp32["sparse_cosine_min"].enforced and fp32["sparse_cosine_min"].value >= 0.99999
    assert fp32["sparse_same_indices"].value == 1.0 and fp32["sparse_top64_overlap_min"].value >= 0.95
    int8 = manifest.validation["int8"].metrics
    assert 0 < int8["sparse_cosine_min"].value <= 1 and "sparse_top64_overlap_min" in int8
    assert manifest.options.get("variants") == ["fp32", "int8"]


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_a_texts_sparse_vector_does_not_depend_on_its_batch(sparse_export: Path, variant: Variant) -> None:
    """The sparse graph on a text's states padded beside a longer text whose states are 100 times larger
    (they would set a shared scale), its padding 100 times larger too, gives the weights it gives the same
    states alone (int8: one scale a sequence, its padded positions a real token's state), but for
    float32's last bits: ONNX Runtime's kernels for 4 rows and for 18 sum in other orders, in fp32 as in
    int8 (3e-8 apart here; a shared scale or a padded state in the max moves weights by orders more)."""
    manifest = load_manifest(sparse_export)
    splade = ort.InferenceSession(str(sparse_export / manifest.graphs["sparse"][variant].file))
    rng = np.random.default_rng(0)
    states = rng.standard_normal((2, 9, cast(int, TINY_CONFIG["hidden_size"]))).astype(np.float32)
    states[0] *= 100
    states[1, 4:] *= 100  # the short text: 4 tokens, then padding, whose states must count for nothing
    mask = np.ones((2, 9), np.int64)
    mask[1, 4:] = 0

    def run(hidden: np.ndarray, m: np.ndarray) -> np.ndarray:
        return np.asarray(splade.run([SPARSE_OUTPUT], {LAST_HIDDEN_STATE: hidden, "attention_mask": m})[0])

    alone = run(states[1:, :4], mask[1:, :4])
    np.testing.assert_allclose(run(states, mask)[1], alone[0], rtol=1e-5, atol=1e-6)


def test_the_export_equals_sentence_transformers_sparse_encoder(
    sparse_export: Path, tiny_source_dir: Path
) -> None:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    model = SparseEncoder(modules=[MLMTransformer(str(tiny_source_dir)), SpladePooling("max")], device="cpu")
    want = model.encode(TEXTS, convert_to_sparse_tensor=False).numpy()
    got = _splade_of(sparse_export, "fp32", TEXTS)
    assert got.shape == want.shape == (len(TEXTS), 21128)
    agreement = sparse_agreement(got, want)  # the tolerance's reasons: export/validate.py, SPARSE_RTOL
    assert agreement["max_rel_diff"] <= SPARSE_RTOL, agreement
    assert agreement["mismatch_weight_of_max"] <= SPARSE_RTOL * SPARSE_RELATIVE_FLOOR, agreement


def test_a_sparse_encoder_folder_is_served_as_it_was_trained(tiny_source_dir: Path, tmp_path: Path) -> None:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    folder = tmp_path / "splade"
    modules = [MLMTransformer(str(tiny_source_dir), max_seq_length=64), SpladePooling("sum", "log1p_relu")]
    SparseEncoder(modules=modules, device="cpu").save(str(folder))
    config = sentence.read_sparse(folder)
    assert config is not None and config.sparse == Sparse(pooling="sum", activation="log1p_relu")
    assert config.max_seq_length == 64 and sentence.read(folder) is None
    out = tmp_path / "model"
    run_export(ExportOptions(out=out, model=str(folder), variants=("fp32",)), _quiet)
    manifest = load_manifest(out)
    assert manifest.sparse == config.sparse and manifest.tokenizer.max_length == 64
    assert manifest.validation["fp32"].metrics["sparse_cosine_min"].value >= 0.99999
    with pytest.raises(ExportError, match=r"--sparse max contradicts .* SpladePooling \(sum\)"):
        run_export(
            ExportOptions(out=tmp_path / "other", model=str(folder), variants=("fp32",), sparse="max"), _quiet
        )


def test_an_inference_free_splade_folder_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.sparse_encoder.modules.Router",
                },
                {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": "SpladePooling"},
            ]
        )
    )
    with pytest.raises(ExportError, match=r"inference-free .* SparseStaticEmbedding lookup"):
        sentence.read_sparse(tmp_path)
    (tmp_path / "modules.json").write_text(
        json.dumps(
            [
                {"path": "", "type": "MLMTransformer"},
                {"path": "1", "type": "SpladePooling"},
                {"type": "Normalize"},
            ]
        )
    )
    with pytest.raises(ExportError, match="MLMTransformer → SpladePooling → Normalize cannot be served"):
        sentence.read_sparse(tmp_path)


def test_the_flag_on_a_model_without_a_masked_lm_head_is_refused(tmp_path: Path) -> None:
    from transformers import BertConfig, BertModel

    from export.source import bert_base_chinese_vocab, write_source_folder

    source = tmp_path / "plain"
    write_source_folder(source, TINY_CONFIG, bert_base_chinese_vocab())
    BertModel(BertConfig.from_dict(TINY_CONFIG)).save_pretrained(source)
    with pytest.raises(ExportError, match=r"has no masked-LM head .* sparse vectors need one"):
        run_export(
            ExportOptions(out=tmp_path / "out", model=str(source), variants=("fp32",), sparse="max"), _quiet
        )


def test_the_flag_enters_the_fingerprint_only_when_given() -> None:
    plain = ExportOptions(out=Path("x")).fingerprint_fields()
    assert "sparse" not in plain
    assert ExportOptions(out=Path("x"), sparse="sum").fingerprint_fields() == {**plain, "sparse": "sum"}
