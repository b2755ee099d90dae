"""The fast path's routes come from the API's own declarations."""

from __future__ import annotations

from app.api.fast import fast_routes
from app.api.openai_routes import router as openai_router
from app.api.openai_schemas import OpenAIEmbeddingRequest
from app.api.routes import router
from app.api.schemas import EmbedRequest


def test_every_post_data_route_and_only_those_is_served_fast() -> None:
    routes = fast_routes(router, openai_router)
    assert sorted(routes) == [
        "/",
        "/embed",
        "/embed_all",
        "/embeddings",
        "/fill-mask",
        "/similarity",
        "/tokenize",
        "/v1/embeddings",
    ]
    assert routes["/embed"][0] is EmbedRequest and routes["/v1/embeddings"][0] is OpenAIEmbeddingRequest
