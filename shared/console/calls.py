"""What an API route is handed (``Call``) and what it answers (``Answer``), and what a
module of routes needs of the server that mounts them (``Routes``): shared by the server
(``jobfence.console.api``) and the routes kept apart from it
(``jobfence.console.operations``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from jobfence.console.auth import Caller
from jobfence.settings import Settings

if TYPE_CHECKING:
    from starlette.routing import Route

    from jobfence.console.params import Param
    from jobfence.store import Store


@dataclass
class Call:
    """One API request as a route sees it."""

    caller: Caller
    params: dict[str, Any]
    """The route's query parameters, parsed (a default where one was not given)."""
    path: dict[str, Any]
    """The path's parameters, parsed."""
    body: Any
    given: dict[str, str] = field(default_factory=dict)
    """The query parameters as the client gave them (for the next page's link)."""
    traceparent: str | None = None  # the W3C header: the trace a submit's jobs join


@dataclass
class Answer:
    body: Any
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


class Routes(Protocol):
    """The server, as a module of routes sees it."""

    settings: Settings
    log: Any

    def route(self, path: str, handler: Callable[[Store, Call], Answer], *,
              method: str = "GET", operate: bool = False,
              query: Mapping[str, Param] | None = None) -> Route:
        """``handler`` at ``path``, taking the query parameters ``query`` declares."""
        ...
