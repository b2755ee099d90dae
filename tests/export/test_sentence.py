"""Reading a sentence-transformers folder's settings, refusing what cannot be served with one line, and
carrying the settings into the export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers.normalizers import Lowercase, Sequence
from transformers import BertConfig

from app.model.manifest import sha256_file
from export import sentence
from export.__main__ import main
from export.source import ExportError, head_architecture, load_tokenizer
from tests.checkpoints import minilm_folder

TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}


def _pooling(index: int, path: str = "1_Pooling") -> dict[str, object]:
    return {"idx": index, "name": str(index), "path": path, "type": "sentence_transformers.models.Pooling"}


def _folder(
    tmp_path: Path, modules: list[dict[str, object]], pooling: dict[str, object] | None = None
) -> Path:
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir(exist_ok=True)
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps(pooling or {"word_embedding_dimension": 8, "pooling_mode_mean_tokens": True})
    )
    return tmp_path


def test_a_plain_bert_folder_has_no_sentence_settings(tmp_path: Path) -> None:
    assert sentence.read(tmp_path) is None


def test_minilm_folder_is_read_with_its_legacy_keys() -> None:
    config = sentence.read(minilm_folder())
    assert config is not None
    assert (config.pooling, config.normalize, config.max_seq_length) == ("mean", True, 256)
    assert config.modules == ("Transformer", "Pooling", "Normalize") and not config.dense


@pytest.mark.parametrize(
    ("pooling", "mode"),
    [
        ({"pooling_mode": "cls"}, "cls"),
        ({"pooling_mode": ["lasttoken"]}, "lasttoken"),
        ({"pooling_mode_mean_sqrt_len_tokens": True}, "mean_sqrt_len"),
        ({"pooling_mode_weightedmean_tokens": True}, "weightedmean"),
        ({"pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": False}, "max"),
        ({"word_embedding_dimension": 8}, "mean"),  # no mode given: sentence-transformers' default
    ],
)
def test_every_pooling_mode_in_either_spelling(tmp_path: Path, pooling: dict[str, object], mode: str) -> None:
    config = sentence.read(_folder(tmp_path, [TRANSFORMER, _pooling(1)], pooling))
    assert config is not None and config.pooling == mode and config.include_prompt


def test_prompts_and_the_tokenizer_limit_of_a_sentence_transformers_5_folder(tmp_path: Path) -> None:
    folder = _folder(tmp_path, [TRANSFORMER, _pooling(1)], {"pooling_mode": "cls", "include_prompt": False})
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "查询：", "document": ""}, "default_prompt_name": "query"})
    )
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    config = sentence.read(folder)
    assert config is not None and not config.include_prompt
    assert config.prompts == {"query": "查询：", "document": ""} and config.default_prompt_name == "query"
    assert config.max_seq_length == 64


def test_a_dense_module_is_read_with_its_weights(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    folder = _folder(tmp_path, [TRANSFORMER, _pooling(1), dense])
    (folder / "2_Dense").mkdir()
    weight = np.arange(24, dtype=np.float32).reshape(3, 8)
    save_file({"linear.weight": weight}, str(folder / "2_Dense" / "model.safetensors"))
    (folder / "2_Dense" / "config.json").write_text(
        json.dumps(
            {
                "in_features": 8,
                "out_features": 3,
                "bias": False,
                "activation_function": "torch.nn.modules.activation.Tanh",
            }
        )
    )
    config = sentence.read(folder)
    assert config is not None and len(config.dense) == 1
    assert config.dense[0].activation == "tanh" and config.dense[0].bias is None
    np.testing.assert_array_equal(config.dense[0].weight, weight)


@pytest.mark.parametrize(
    ("modules", "pooling", "words"),
    [
        (
            [
                TRANSFORMER,
                _pooling(1),
                {"idx": 2, "path": "2_LayerNorm", "type": "sentence_transformers.models.LayerNorm"},
            ],
            None,
            ["sentence_transformers.models.LayerNorm", "2_LayerNorm", "cannot be served"],
        ),
        (
            [TRANSFORMER, _pooling(1)],
            {"pooling_mode": ["cls", "mean"]},
            ["several modes", "cls + mean"],
        ),
        (
            [
                TRANSFORMER,
                {"idx": 1, "path": "", "type": "sentence_transformers.models.Normalize"},
                _pooling(2),
            ],
            None,
            ["Transformer → Normalize → Pooling", "cannot be served"],
        ),
        ([TRANSFORMER], None, ["Transformer → Pooling"]),
        (
            [{**TRANSFORMER, "path": "0_Transformer"}, _pooling(1)],
            None,
            ["0_Transformer"],
        ),
    ],
)
def test_what_cannot_be_served_is_refused_naming_it(
    tmp_path: Path, modules: list[dict[str, object]], pooling: dict[str, object] | None, words: list[str]
) -> None:
    with pytest.raises(ExportError) as caught:
        sentence.read(_folder(tmp_path, modules, pooling))
    message = str(caught.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_an_unserved_dense_activation_is_refused(tmp_path: Path) -> None:
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    folder = _folder(tmp_path, [TRANSFORMER, _pooling(1), dense])
    (folder / "2_Dense").mkdir()
    (folder / "2_Dense" / "config.json").write_text(
        json.dumps({"in_features": 8, "out_features": 3, "activation_function": "my.package.Swish"})
    )
    with pytest.raises(ExportError, match=r"Dense activation .my\.package\.Swish. cannot be served"):
        sentence.read(folder)


def test_heads_that_are_not_served_are_refused_by_architecture() -> None:
    assert (
        head_architecture(BertConfig(architectures=["BertForTokenClassification"]))
        == "BertForTokenClassification"
    )
    assert head_architecture(BertConfig(architectures=["BertModel"])) is None
    with pytest.raises(ExportError, match="BertForQuestionAnswering cannot be served"):
        head_architecture(BertConfig(architectures=["BertForQuestionAnswering"]))


def test_the_cli_refuses_an_unserved_module_in_one_line(
    tiny_source_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "src"
    shutil.copytree(tiny_source_dir, folder)
    lstm = {"idx": 2, "name": "2", "path": "2_LSTM", "type": "sentence_transformers.models.LSTM"}
    _folder(folder, [TRANSFORMER, _pooling(1), lstm])
    assert main(["--model", str(folder), "--out", str(tmp_path / "out"), "--variants", "fp32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sentence_transformers.models.LSTM" in err[0] and "cannot be served" in err[0]
    assert not (tmp_path / "out").exists()


def test_dense_weights_are_saved_with_their_hashes_and_shapes(tmp_path: Path) -> None:
    weight = np.arange(24, dtype=np.float32).reshape(3, 8)
    layers = (
        sentence.Dense(weight, None, "tanh"),
        sentence.Dense(weight[:2, :3], np.ones(2, np.float32), "relu"),
    )
    entries, files = sentence.save_dense(tmp_path, layers)
    assert [(e.in_features, e.out_features, e.activation, e.bias) for e in entries] == [
        (8, 3, "tanh", None),
        (3, 2, "relu", "dense_1.bias.npy"),
    ]
    assert sorted(files) == ["dense_0.weight.npy", "dense_1.bias.npy", "dense_1.weight.npy"]
    assert all(files[name] == sha256_file(tmp_path / name) for name in files)
    np.testing.assert_array_equal(np.load(tmp_path / entries[1].weight), weight[:2, :3])


def test_lower_casing_is_put_in_front_of_the_tokenizer_once(tiny_source_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_source_dir, 32)
    sentence.lowercase(tokenizer)
    sentence.lowercase(tokenizer)  # already there: not added again
    normalizer = tokenizer.backend_tokenizer.normalizer
    assert isinstance(normalizer, Sequence) and sum(isinstance(n, Lowercase) for n in normalizer) == 1
    assert normalizer.normalize_str("ABC Déjà") == "abc déjà"
