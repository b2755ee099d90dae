"""The models one service serves, by name, and which of them answers a request (docs/models.md says how a
request names one, and which a request that names none gets). A service of one model answers every request
with it, whatever the request's ``model`` says: OpenAI's clients send names of their own."""

from __future__ import annotations

from collections.abc import Sequence

from app.errors import UnknownModel
from app.tasks.core import EMBEDDING_ROUTES
from app.tasks.service import Service
from app.telemetry.context import CURRENT_MODEL

# Paths that are another route's twin, by the route whose default they take.
ALIASES = {"/embeddings": "/v1/embeddings"}


class Models:
    """The services of one process's models, the first the default one."""

    def __init__(self, services: Sequence[Service], named: bool) -> None:
        # named: the models were given names (ZHEMBED_MODELS): a request's model must be one.
        if not services:
            raise ValueError("a service serves at least one model")
        self.services = list(services)
        self.named = named
        self.by_name = {service.served_name: service for service in self.services}
        self._defaults: dict[str, Service] = {}

    @property
    def names(self) -> list[str]:
        return [service.served_name for service in self.services]

    @property
    def ready(self) -> bool:
        """Whether every model is warm (each is marked ready once all are)."""
        return all(service.ready for service in self.services)

    def get(self, name: str) -> Service:
        """The model served as ``name``; else UnknownModel, which lists the names served."""
        service = self.by_name.get(name)
        if service is None:
            served = ", ".join(repr(n) for n in self.names)
            raise UnknownModel(f"no model {name!r} here: this server serves {served}")
        return service

    def pick(self, name: str | None, route: str) -> Service:
        """The model that answers a request to ``route`` naming ``name``, also left in ``CURRENT_MODEL``."""
        service = self.get(name) if name is not None and self.named else self.default(route)
        CURRENT_MODEL.set(service.served_name)
        return service

    def default(self, route: str) -> Service:
        """The model a request to ``route`` that names none gets."""
        route = ALIASES.get(route, route)
        service = self._defaults.get(route)
        if service is None:
            serving = [s for s in self.services if route in s.routes()]
            if route in EMBEDDING_ROUTES:
                serving = [s for s in serving if s.kind == "embedding"] or serving
            service = self._defaults[route] = (serving or self.services)[0]
        return service
