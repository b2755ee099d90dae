"""The naive baseline: FastAPI + transformers in PyTorch fp32, one forward pass per request, no batching,
written the way a typical tutorial writes it. The benchmark's floor; do not optimise it.

    NAIVE_MODEL=<HF folder> [NAIVE_TWIN=1] ZHEMBED_PORT=8081 python -m loadtest.baselines.naive_service

``NAIVE_TWIN=1`` builds the random-weight twin from the folder's config with the export's seed (the
same weights ``python -m export --twin`` exports), for source folders that hold no weights. It answers
``POST /embed`` with ``{"inputs": str | [str]}`` (CLS vector, normalised) and ``GET /ready``.
"""

from __future__ import annotations

import os

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import AutoModel, AutoTokenizer, BertConfig, BertForPreTraining, PreTrainedModel

MODEL = os.environ.get("NAIVE_MODEL", "bert-base-chinese")


def load_model(folder: str, twin: bool) -> PreTrainedModel:
    if twin:
        from export.spec import SEED  # the export's seed: same random weights as the ONNX twin

        torch.manual_seed(SEED)
        return BertForPreTraining(BertConfig.from_pretrained(folder)).bert.eval()
    return AutoModel.from_pretrained(folder).eval()


tokenizer = AutoTokenizer.from_pretrained(MODEL)
model = load_model(MODEL, os.environ.get("NAIVE_TWIN") == "1")
app = FastAPI()


class EmbedRequest(BaseModel):
    inputs: str | list[str]


@app.get("/ready")
def ready() -> dict[str, bool]:
    return {"ready": True}


@app.post("/embed")
def embed(request: EmbedRequest) -> list[list[float]]:
    texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
    batch = tokenizer(texts, padding=True, truncation=True, max_length=512, return_tensors="pt")
    with torch.no_grad():
        output = model(**batch)
    vectors = torch.nn.functional.normalize(output.last_hidden_state[:, 0], dim=-1)
    return vectors.tolist()


if __name__ == "__main__":
    uvicorn.run(
        app,
        host=os.environ.get("ZHEMBED_HOST", "127.0.0.1"),
        port=int(os.environ.get("ZHEMBED_PORT", "8081")),
        log_level="warning",
    )
