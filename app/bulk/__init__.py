"""Bulk embedding: a corpus into Parquet shards with the service's own engine (``python -m app.bulk``).

A job, not a server: it reads the input as a stream (:mod:`app.bulk.sources`), keeps a large window of
texts in the engine so batches are cut by length (:mod:`app.bulk.embedder`), writes shards that appear
only whole and continues after a crash (:mod:`app.bulk.output`, :mod:`app.bulk.runner`), shows its
progress (:mod:`app.bulk.progress`), and runs past one machine on Ray Data (:mod:`app.bulk.ray_job`).
With ``--format openai-batch`` it answers an OpenAI batch file with the HTTP routes themselves
(:mod:`app.bulk.openai_batch`, :mod:`app.bulk.batch_job`, :mod:`app.bulk.batch_cli`, :mod:`app.bulk.batch_ray`).
It stands beside :mod:`app.serving`, on the same tasks and engine; nothing below it imports it.
"""
