"""Who calls `jobfence serve` and what they may do, without a server: the three auth modes,
permissions by user and group, the TokenReview cache, the loopback rules of `none`, and the
writes a browser may have been tricked into. Arbitrary headers end in a typed refusal,
never in a crash."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobfence.cluster import Identity
from jobfence.console.auth import (
    REVIEW_CACHE_SIZE,
    Authenticator,
    check_write,
    host_of,
    is_loopback_host,
)
from jobfence.errors import (
    ClusterError,
    ConfigError,
    Forbidden,
    JobfenceError,
    Unauthenticated,
    Unavailable,
)
from jobfence.settings import load_settings


def authenticator(mode: str, review: object = None, bind: str = "0.0.0.0",
                  **kw: str) -> Authenticator:
    cfg = load_settings(database_url="dbname=x", auth=mode, **kw)
    return Authenticator(cfg, bind_host=bind, review=review)  # type: ignore[arg-type]


@pytest.mark.parametrize(("host", "loopback"), [
    ("localhost", True), ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True),
    ("[::1]", True), ("app.localhost", True), ("LOCALHOST", True),
    ("0.0.0.0", False), ("10.0.0.1", False), ("example.com", False), ("localhost.evil", False),
    ("", False), ("::", False)])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_host_of_a_host_header() -> None:
    assert host_of("127.0.0.1:8080") == "127.0.0.1"
    assert host_of("[::1]:8080") == "::1"
    assert host_of("Example.com") == "example.com"


def test_none_only_on_loopback_and_only_for_loopback_hosts() -> None:
    with pytest.raises(ConfigError, match="loopback"):
        authenticator("none", bind="0.0.0.0")
    auth = authenticator("none", bind="127.0.0.1")
    assert auth.caller({"host": "127.0.0.1:8080"}).may_operate
    assert auth.caller({"host": "localhost:8080"}).may_operate
    with pytest.raises(Forbidden):
        auth.caller({"host": "rebound.example:8080"})


def test_proxy_identity_and_permissions() -> None:
    auth = authenticator("proxy", auth_readers="group:dev,eve", auth_operators="alice,group:ops")
    with pytest.raises(Unauthenticated):
        auth.caller({})
    alice = auth.caller({"x-forwarded-user": "alice"})
    assert (alice.may_read, alice.may_operate) == (False, True)
    alice.require(operate=True)
    dev = auth.caller({"x-forwarded-user": "bob", "x-forwarded-groups": "dev, qa"})
    assert dev.groups == ("dev", "qa") and (dev.may_read, dev.may_operate) == (True, False)
    with pytest.raises(Forbidden, match="operator"):
        dev.require(operate=True)
    stranger = auth.caller({"x-forwarded-user": "mallory"})
    with pytest.raises(Forbidden, match="read"):
        stranger.require()
    custom = authenticator("proxy", auth_proxy_user_header="X-Auth-Request-User")
    assert custom.caller({"x-auth-request-user": "carol"}).user == "carol"


def test_token_review_is_asked_once_a_minute_per_token() -> None:
    asked: list[str] = []

    def review(token: str) -> Identity | None:
        asked.append(token)
        return Identity("sa:ops:oncall", ("ops",)) if token == "good" else None

    auth = authenticator("tokenreview", review, auth_operators="group:ops")
    with pytest.raises(Unauthenticated):
        auth.caller({})
    with pytest.raises(Unauthenticated):
        auth.caller({"authorization": "Basic Zm9vOmJhcg=="})
    for _ in range(3):
        assert auth.caller({"authorization": "Bearer good"}).may_operate
        with pytest.raises(Unauthenticated):
            auth.caller({"authorization": "Bearer bad"})
    assert asked == ["good", "bad"]
    for i in range(REVIEW_CACHE_SIZE + 50):  # bounded, however many tokens come
        with pytest.raises(Unauthenticated):
            auth.caller({"authorization": f"Bearer t{i}"})
    assert len(auth._cache) == REVIEW_CACHE_SIZE


def test_a_cluster_that_cannot_review_is_unavailable() -> None:
    def review(token: str) -> Identity | None:
        raise ClusterError("HTTP 500")

    with pytest.raises(Unavailable):
        authenticator("tokenreview", review).caller({"authorization": "Bearer x"})
    with pytest.raises(ConfigError, match="JOBFENCE_CLUSTER"):
        authenticator("tokenreview", None)


def test_writes_must_be_json_from_this_origin() -> None:
    json_post = {"content-type": "application/json", "host": "jf.example"}
    check_write("GET", {}, "http")
    check_write("POST", json_post, "http")
    check_write("POST", {**json_post, "origin": "http://jf.example"}, "http")
    check_write("POST", {**json_post, "origin": "https://jf.example",
                         "x-forwarded-proto": "https"}, "http")  # TLS ends at the proxy
    check_write("POST", {**json_post, "sec-fetch-site": "same-origin"}, "http")
    for bad in ({"content-type": "text/plain"}, {"content-type": "multipart/form-data"},
                {**json_post, "origin": "http://evil.example"},
                {**json_post, "origin": "null"},
                {**json_post, "sec-fetch-site": "cross-site"},
                {**json_post, "sec-fetch-site": "same-site"}):
        with pytest.raises(Forbidden):
            check_write("POST", bad, "http")


HEADER = st.sampled_from(["host", "authorization", "x-forwarded-user", "x-forwarded-groups",
                          "origin", "content-type", "sec-fetch-site"])


@settings(max_examples=300, derandomize=True, database=None)
@given(mode=st.sampled_from(["none", "proxy", "tokenreview"]),
       headers=st.dictionaries(HEADER, st.text(max_size=60), max_size=5),
       method=st.sampled_from(["GET", "POST"]))
def test_any_headers_end_in_a_caller_or_a_typed_refusal(
        mode: str, headers: dict[str, str], method: str) -> None:
    auth = authenticator(mode, lambda t: Identity(t[:20]) if t.isalnum() else None,
                         bind="127.0.0.1")
    try:
        check_write(method, headers, "http")
        caller = auth.caller(headers)
        caller.require()
    except JobfenceError:
        return
    assert caller.user
