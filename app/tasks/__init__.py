"""What a request means, a module per task over one shared core (:mod:`app.tasks.core`):

- :mod:`app.tasks.embeddings`: vectors (``/embed``, ``/``, ``/v1/embeddings``), ``/similarity``,
  token vectors (``/embed_all``);
- :mod:`app.tasks.fill_mask`: ``/fill-mask``;
- :mod:`app.tasks.heads`: ``/predict``, ``/rerank``, ``/token-classification``;
- :mod:`app.tasks.tokenize`: ``/tokenize``;
- :mod:`app.tasks.service`: the core with its tasks, and the warm-up; :mod:`app.tasks.info`: ``/info``.

Their helpers: the request options and their checks (:mod:`~app.tasks.options`), long inputs
(:mod:`~app.tasks.windows`), layer arithmetic (:mod:`~app.tasks.layers`), ``/embed_all``'s token rows
(:mod:`~app.tasks.token_rows`), token-id inputs (:mod:`~app.tasks.token_ids`), entities
(:mod:`~app.tasks.entities`), and what a task returns (:mod:`~app.tasks.answers`). Nothing here knows
HTTP or gRPC.
"""
