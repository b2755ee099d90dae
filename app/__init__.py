"""zhembed: embeddings, similarity and fill-mask for Chinese BERT on ONNX Runtime."""

__version__ = "0.1.0"
