"""The request and response shapes on the wire, a module per task; the request half is TEI-compatible
where TEI has the same endpoint. HTTP validates bodies with them and gRPC reads its messages through
the same models, so the same mistake gets the same message on both."""
