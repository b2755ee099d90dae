"""The export stage: a Hugging Face BERT checkpoint → validated ONNX graphs and a manifest.

Runs with torch, transformers and optimum (the ``export`` extra); the service never imports this package.
"""
