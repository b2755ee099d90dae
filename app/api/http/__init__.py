"""HTTP: thin routes (TEI's, ours, OpenAI's), the one-function data path in front of the middleware, and
the middleware itself (request metrics, body limit, client disconnects)."""
