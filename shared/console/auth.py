"""Who calls ``jobfence serve``, and what they may do.

Every API request is authenticated one of three ways (``JOBFENCE_AUTH``):

- ``tokenreview``: ``Authorization: Bearer TOKEN``, a token the Kubernetes API vouches for
  (a TokenReview; answers are remembered for a minute, so a console refreshing every two
  seconds does not ask each time);
- ``proxy``: the user (and groups) in the headers an authenticating proxy in front sets —
  the server must be reachable only through that proxy;
- ``none``: everyone is an operator; refused unless the server listens on a loopback
  address, and then only for requests naming a loopback host (a web page elsewhere cannot
  reach it through a name it controls: DNS rebinding).

Permissions: readers read; operators read and act (``JOBFENCE_AUTH_READERS``,
``JOBFENCE_AUTH_OPERATORS``: user names, ``group:NAME``, ``*``). A user's name and a group's
name never match each other: the lists are read into users and groups apart, a user is
looked up among the users only and a group among the groups only — a user who signed up
as ``group:ops`` is not a member of ``ops``. A user whose name itself starts with
``group:`` or ``user:``, or is ``*``, is listed as ``user:NAME``. A name is never cut
short to fit (a long one could become a listed one): a name too long is refused.

The console's writes are safe from cross-site request forgery: a write must say it is JSON
(``Content-Type: application/json``, which a form cannot send and a cross-site script cannot
send without a CORS preflight the server never grants), and when the browser says where it
comes from (``Origin``, ``Sec-Fetch-Site``) it must be this server.
"""

from __future__ import annotations

import hashlib
import ipaddress
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from jobfence.cluster import Identity
from jobfence.errors import ClusterError, ConfigError, Forbidden, Unauthenticated, Unavailable
from jobfence.limits import Unstorable, check_text
from jobfence.settings import Settings

REVIEW_TTL_SECONDS = 60.0
REVIEW_CACHE_SIZE = 1024
MAX_NAME_CHARS = 1000
"""The longest user or group name taken; a longer one is refused, never cut."""


@dataclass(frozen=True, slots=True)
class Caller:
    user: str
    groups: tuple[str, ...]
    may_read: bool
    may_operate: bool

    def require(self, operate: bool = False) -> None:
        if operate and not self.may_operate:
            raise Forbidden(f"{self.user} may not do this: an operator's permission is needed "
                            "(JOBFENCE_AUTH_OPERATORS)")
        if not (self.may_read or self.may_operate):
            raise Forbidden(f"{self.user} may not read this installation "
                            "(JOBFENCE_AUTH_READERS)")


@dataclass(frozen=True, slots=True)
class Members:
    """Who a permission list names: users and groups kept apart."""

    everyone: bool
    users: frozenset[str]
    groups: frozenset[str]


def members(spec: str, setting: str = "the list") -> Members:
    """``spec`` read: ``*`` (everyone authenticated), ``group:NAME`` (a group),
    ``user:NAME`` or a bare ``NAME`` (a user), comma-separated."""
    everyone = False
    users: set[str] = set()
    groups: set[str] = set()
    for term in (t.strip() for t in spec.split(",")):
        if not term:
            continue
        if term == "*":
            everyone = True
            continue
        kind, named = ((groups, term.removeprefix("group:")) if term.startswith("group:")
                       else (users, term.removeprefix("user:")))
        if not named:
            raise ConfigError(f"{setting}: {term!r} names no one (give group:NAME or "
                              "user:NAME)")
        kind.add(named)
    return Members(everyone, frozenset(users), frozenset(groups))


def matches(allowed: Members, identity: Identity) -> bool:
    """Whether ``allowed`` names the caller: its own name among the users, or one of its
    groups among the groups — never a user's name among the groups, nor the reverse."""
    return (allowed.everyone or identity.user in allowed.users
            or not allowed.groups.isdisjoint(identity.groups))


def checked(identity: Identity) -> Identity:
    """``identity`` if its names can be matched and stored as they are; Unauthenticated
    otherwise (a name is never cut: cut, it could become another)."""
    for name in (identity.user, *identity.groups):
        if len(name) > MAX_NAME_CHARS:
            raise Unauthenticated(f"a user or group name longer than {MAX_NAME_CHARS} "
                                  "characters is refused")
        try:
            check_text(name, "a user or group name")
        except Unstorable as exc:
            raise Unauthenticated(str(exc)) from None
    return identity


def is_loopback_host(host: str) -> bool:
    """A host (name or address, without port) that can only mean this machine."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The host of a Host header (``name:port``, ``[::1]:port``)."""
    return urlsplit(f"//{header}").hostname or ""


class Authenticator:
    def __init__(self, settings: Settings, *, bind_host: str,
                 review: Callable[[str], Identity | None] | None) -> None:
        self.mode = settings.auth
        if self.mode == "none" and not is_loopback_host(bind_host):
            raise ConfigError(f"JOBFENCE_AUTH=none serves everyone as an operator: it is "
                              f"refused on {bind_host} (only on a loopback address, such as "
                              "127.0.0.1)")
        if self.mode == "tokenreview" and review is None:
            raise ConfigError("JOBFENCE_AUTH=tokenreview needs the Kubernetes API "
                              "(JOBFENCE_CLUSTER=kubernetes)")
        self.review = review
        self.readers = members(settings.auth_readers, "JOBFENCE_AUTH_READERS")
        self.operators = members(settings.auth_operators, "JOBFENCE_AUTH_OPERATORS")
        self.user_header = settings.auth_proxy_user_header.lower()
        self.groups_header = settings.auth_proxy_groups_header.lower()
        self._cache: OrderedDict[bytes, tuple[float, Identity | None]] = OrderedDict()
        self._lock = threading.Lock()

    def caller(self, headers: Mapping[str, str]) -> Caller:
        """The caller of a request (``Unauthenticated`` when it cannot be told)."""
        if self.mode == "none":
            if not is_loopback_host(host_of(headers.get("host", ""))):
                raise Forbidden("this server answers only requests to a loopback host")
            return Caller("local", (), True, True)
        identity = checked(self._proxy(headers) if self.mode == "proxy"
                           else self._bearer(headers))
        return Caller(identity.user, identity.groups,
                      matches(self.readers, identity), matches(self.operators, identity))

    def _proxy(self, headers: Mapping[str, str]) -> Identity:
        user = headers.get(self.user_header, "").strip()
        if not user:
            raise Unauthenticated(f"no {self.user_header} header: requests must come "
                                  "through the authenticating proxy")
        groups = tuple(g.strip() for g in headers.get(self.groups_header, "").split(",")
                       if g.strip())
        return Identity(user, groups)

    def _bearer(self, headers: Mapping[str, str]) -> Identity:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("a bearer token is required (Authorization: Bearer TOKEN)")
        identity = self._reviewed(token)
        if identity is None:
            raise Unauthenticated("the token is not valid")
        return identity

    def _reviewed(self, token: str) -> Identity | None:
        key = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit and hit[0] > now:
                return hit[1]
        assert self.review is not None
        try:
            identity = self.review(token)
        except ClusterError as exc:
            raise Unavailable(f"cannot check the token: {exc}") from exc
        with self._lock:
            self._cache[key] = (now + REVIEW_TTL_SECONDS, identity)
            self._cache.move_to_end(key)
            while len(self._cache) > REVIEW_CACHE_SIZE:
                self._cache.popitem(last=False)
        return identity


def check_write(method: str, headers: Mapping[str, str], scheme: str) -> None:
    """Refuse a write a browser may have been tricked into sending (see the module)."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise Forbidden("a write must be sent as Content-Type: application/json")
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise Forbidden(f"a write from another site ({site}) is refused")
    origin = headers.get("origin")
    if origin is not None and origin != f"{scheme}://{headers.get('host', '')}":
        forwarded = headers.get("x-forwarded-proto")
        if not forwarded or origin != f"{forwarded}://{headers.get('host', '')}":
            raise Forbidden("a write from another origin is refused")
