"""What a request means: a module per task over one shared core (:mod:`app.tasks.core`), joined by
:mod:`app.tasks.service`. Every task prepares its inputs in one stage (:mod:`app.tasks.prepare`); the
helpers beside them hold the request options, long inputs, layer arithmetic, token-id inputs, entities
and answers. Nothing here knows HTTP or gRPC.
"""
