"""Who calls `jobfence serve` and what they may do, without a server: the three auth modes,
permissions by user and group (a user's name and a group's name never match each other,
whatever they are called), the TokenReview cache, the loopback rules of `none`, and the
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


def test_a_user_named_like_a_listed_group_is_not_a_member_of_it() -> None:
    """A proxy passes the name a user chose at sign-up: "group:ops" is a name like another."""
    auth = authenticator("proxy", auth_readers="group:dev", auth_operators="alice,group:ops")
    impostor = auth.caller({"x-forwarded-user": "group:ops"})
    assert (impostor.may_read, impostor.may_operate) == (False, False)
    with pytest.raises(Forbidden):
        impostor.require()
    assert auth.caller({"x-forwarded-user": "group:dev"}).may_read is False
    member = auth.caller({"x-forwarded-user": "group:ops", "x-forwarded-groups": "ops"})
    assert member.may_operate  # a member of ops, whatever the name
    # Nor is a member of a group named like a listed user that user.
    assert not auth.caller({"x-forwarded-user": "bob", "x-forwarded-groups": "alice"}
                           ).may_operate


def test_a_token_of_a_user_named_like_a_listed_group_is_not_a_member_of_it() -> None:
    identities = {"impostor": Identity("group:ops", ()), "member": Identity("eve", ("ops",)),
                  "named": Identity("ops", ("alice",))}
    auth = authenticator("tokenreview", identities.get, auth_operators="alice,group:ops")
    assert not auth.caller({"authorization": "Bearer impostor"}).may_operate
    assert auth.caller({"authorization": "Bearer member"}).may_operate
    assert not auth.caller({"authorization": "Bearer named"}).may_operate


def test_without_auth_the_caller_is_local_whatever_the_headers_say() -> None:
    auth = authenticator("none", bind="127.0.0.1", auth_operators="group:ops")
    caller = auth.caller({"host": "127.0.0.1:8080", "x-forwarded-user": "group:ops",
                          "x-forwarded-groups": "ops", "authorization": "Bearer x"})
    assert (caller.user, caller.groups) == ("local", ())


def test_a_user_whose_name_looks_like_a_group_is_listed_as_user_name() -> None:
    auth = authenticator("proxy", auth_operators="user:group:ops, user:user:x, user:*")
    assert auth.caller({"x-forwarded-user": "group:ops"}).may_operate
    assert auth.caller({"x-forwarded-user": "user:x"}).may_operate
    assert not auth.caller({"x-forwarded-user": "x"}).may_operate
    assert auth.caller({"x-forwarded-user": "*"}).may_operate  # "user:*" is not everyone
    assert not auth.caller({"x-forwarded-user": "bob"}).may_operate
    assert not auth.caller({"x-forwarded-user": "bob", "x-forwarded-groups": "ops"}
                           ).may_operate


@pytest.mark.parametrize("listed", ["group:", "user:", "alice, group: "])
def test_an_entry_naming_nobody_is_a_configuration_error(listed: str) -> None:
    with pytest.raises(ConfigError, match="names no"):
        authenticator("proxy", auth_operators=listed)


def test_a_user_name_is_never_cut_to_match_another() -> None:
    listed = "a" * 200
    auth = authenticator("proxy", auth_operators=listed)
    assert auth.caller({"x-forwarded-user": listed}).may_operate
    with pytest.raises(Unauthenticated, match="longer"):
        auth.caller({"x-forwarded-user": listed + "x" * 1000})
    assert not auth.caller({"x-forwarded-user": listed + "x"}).may_operate


NAME = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp"),
                             exclude_characters=","), min_size=1, max_size=12) \
    | st.sampled_from(["ops", "group:ops", "user:ops", "*", "group:*", "user:", "group:",
                       "system:masters", "alice"])


@settings(max_examples=300, derandomize=True, database=None)
@given(user=NAME, groups=st.lists(NAME, max_size=3), users_listed=st.lists(NAME, max_size=3),
       groups_listed=st.lists(NAME, max_size=3), mode=st.sampled_from(["proxy", "tokenreview"]),
       bare=st.booleans())
def test_user_names_and_group_names_never_match_each_other(
        user: str, groups: list[str], users_listed: list[str], groups_listed: list[str],
        mode: str, bare: bool) -> None:
    """Whatever the names: a caller is an operator exactly when their own name is listed as
    a user, or one of their groups as a group — in the proxy's headers and in a token's
    review alike."""

    def as_user(name: str) -> str:
        plain = bare and name != "*" and not name.startswith(("group:", "user:"))
        return name if plain else f"user:{name}"

    operators = ",".join([as_user(u) for u in users_listed]
                         + [f"group:{g}" for g in groups_listed])
    identity = Identity(user, tuple(groups))
    auth = authenticator(mode, lambda token: identity, auth_operators=operators,
                         auth_readers="")
    headers = ({"x-forwarded-user": user, "x-forwarded-groups": ",".join(groups)}
               if mode == "proxy" else {"authorization": "Bearer t"})
    caller = auth.caller(headers)
    assert caller.user == user and set(caller.groups) == set(groups)
    expected = user in users_listed or bool(set(groups) & set(groups_listed))
    assert caller.may_operate is expected
    assert caller.may_read is False


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
