"""gRPC beside HTTP: TEI's ``tei.v1`` services and ours (``zhembed.v1``), health and reflection; each
message read through the HTTP route's schema, each error through the one table."""
