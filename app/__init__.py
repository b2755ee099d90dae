"""zhembed: embeddings, similarity, fill-mask and fine-tuned heads for Chinese BERT on ONNX Runtime.

The packages, from what a caller reaches down to what everything stands on (a package imports only from
its own folder and the ones below it; ``tests/app/test_layering.py`` holds that):

- :mod:`app.serving`: how processes start (``python -m app``, the app factory, uvicorn, workers);
- :mod:`app.api`: how it is reached (HTTP in :mod:`app.api.http`, gRPC in :mod:`app.api.rpc`, their
  shared schemas, error table, keys and drain);
- :mod:`app.tasks`: what a request means (a module per task over one shared core, and their helpers);
- :mod:`app.engine` and :mod:`app.cache`: how it runs (admission, tokenisation, batching, inference,
  post-processing; the vector cache);
- :mod:`app.model`: the exported model (manifest, ONNX sessions, tokenizer, Dense modules);
- :mod:`app.telemetry`: how it is watched (metrics, traces, logs, timings);
- :mod:`app.settings` and :mod:`app.errors`: the one frozen settings object and the typed errors.
"""

__version__ = "0.1.0"
