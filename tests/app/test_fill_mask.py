"""Fill-mask predictions in the Hugging Face pipeline's terms."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.fill_mask import predictions


def test_each_mask_gets_its_top_k_with_the_filled_sequence(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    info = tiny_model.manifest.tokenizer
    (enc,) = tokenizer.encode_batch(["北京是中国的首都"])
    ids = np.asarray(enc.ids, dtype=np.int64)
    ids[2] = info.mask_id
    probs = np.zeros((1, 21128), dtype=np.float32)  # bert-base-chinese's vocabulary
    jing = int(enc.ids[2])
    other = 771
    probs[0, jing], probs[0, other] = 0.7, 0.2  # two candidates, most probable first
    (only,) = predictions(tokenizer, ids, (2,), probs, top_k=2)
    assert [p["token"] for p in only] == [jing, other]
    assert [p["score"] for p in only] == [np.float32(0.7).item(), np.float32(0.2).item()]
    assert only[0]["sequence"].replace(" ", "") == "北京是中国的首都"  # one mask: special tokens dropped
    assert only[0]["token_str"] == tokenizer.decode([jing], skip_special_tokens=False)


def test_with_several_masks_the_others_stay_visible(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    info = tiny_model.manifest.tokenizer
    (enc,) = tokenizer.encode_batch(["北京是中国的首都"])
    ids = np.asarray(enc.ids, dtype=np.int64)
    ids[1] = ids[2] = info.mask_id
    probs = np.full((2, 21128), 1 / 21128, dtype=np.float32)
    out = predictions(tokenizer, ids, (1, 2), probs, top_k=1)
    assert len(out) == 2 and all(len(p) == 1 for p in out)
    assert "[MASK]" in out[0][0]["sequence"] and "[CLS]" in out[0][0]["sequence"]
