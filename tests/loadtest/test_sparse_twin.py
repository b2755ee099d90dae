"""``python -m loadtest.sparse_twin``'s parts: the texts it picks, and a SparseEncoder folder that holds the
twin's weights (on the tiny config: bert-base-chinese's takes minutes). The whole run is in
docs/performance.md."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from app.model.manifest import Sparse
from export import sentence
from export.source import load, resolve
from export.validate import torch_splade
from loadtest.sparse_twin import mixed_lengths, write_sparse_encoder, write_twin_checkpoint
from tests.conftest import TINY_CONFIG


def test_mixed_lengths_spreads_over_every_length_once() -> None:
    texts = ["字" * n for n in range(1, 101)] * 2  # each length twice: picked once
    picked = mixed_lengths(texts, 5)
    assert [len(t) for t in picked] == [1, 26, 51, 75, 100]
    assert [len(t) for t in mixed_lengths(texts, 3, max_chars=11)] == [1, 6, 11]
    with pytest.raises(ValueError, match="4 texts asked for, 3 distinct"):
        mixed_lengths(texts, 4, max_chars=3)


def test_the_folder_computes_with_the_weights_the_twin_export_gives(tmp_path: Path) -> None:
    from sentence_transformers import SparseEncoder
    from transformers import BertTokenizerFast

    checkpoint = write_twin_checkpoint(tmp_path / "checkpoint", TINY_CONFIG)
    folder = write_sparse_encoder(checkpoint, tmp_path / "folder", "max")
    config = sentence.read_sparse(folder)
    assert config is not None and config.sparse == Sparse(pooling="max", activation="relu")
    twin = load(resolve(str(checkpoint), None), twin=True)  # what `python -m export --twin` exports
    assert twin.mlm_head is not None
    texts = ["今天天气很好", "北京是中国的首都，有三千多年的建城史。"]
    batch = BertTokenizerFast.from_pretrained(checkpoint)(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = twin.bert(**batch).last_hidden_state
        want = torch_splade(twin.mlm_head(hidden), batch["attention_mask"], config.sparse).numpy()
    got = SparseEncoder(str(folder), device="cpu").encode(texts, convert_to_sparse_tensor=False).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
