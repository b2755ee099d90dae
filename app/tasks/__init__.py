"""What a request means, a module per task over one shared core (:mod:`app.tasks.core`):

- :mod:`app.tasks.embeddings`: vectors (``/embed``, ``/``, ``/v1/embeddings``), ``/similarity``;
- :mod:`app.tasks.fill_mask`: ``/fill-mask``;
- :mod:`app.tasks.heads`: ``/predict``, ``/rerank``, ``/token-classification``;
- :mod:`app.tasks.tokens`: ``/tokenize`` and token vectors (``/embed_all``);
- :mod:`app.tasks.sparse`: sparse (SPLADE) vectors (``/embed_sparse``);
- :mod:`app.tasks.service`: the core with its tasks, and the warm-up; :mod:`app.tasks.info`: ``/info``.

Every task prepares its inputs in one stage (:mod:`app.tasks.prepare`: the checks of each input, its
token ids, truncation and windows, a problem per input). Their helpers: the request options and their
checks (:mod:`~app.tasks.options`), how a long input is cut (:mod:`~app.tasks.windows`), layer
arithmetic (:mod:`~app.tasks.layers`), token-id inputs (:mod:`~app.tasks.token_ids`), entities
(:mod:`~app.tasks.entities`), and what a task returns (:mod:`~app.tasks.answers`). Nothing here knows
HTTP or gRPC.
"""
