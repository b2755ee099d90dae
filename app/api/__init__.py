"""How the service is reached: HTTP (:mod:`app.api.http`) and gRPC (:mod:`app.api.rpc`), and what both
share: the request shapes (:mod:`app.api.schemas`), the one error table (:mod:`app.api.errors`), API
keys, the drain after SIGTERM, and the wire encodings of vectors. Nothing here computes: it parses,
calls a task, and writes the answer."""
