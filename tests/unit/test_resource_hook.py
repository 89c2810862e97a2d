"""The resource hook of the action plugin API: an action that defines ``validate_resource``
(``jobfence.actions.ResourceValidator``) is asked about each job's ``resource`` at parse
time, after every other check, once per distinct (action, params, resource) of a call; its
refusal — ``InvalidSpec`` or ``ValueError`` — is an ``InvalidSpec`` naming the spec, the
resource and the action; ``Unavailable`` passes through as it is. Fuzzed (hypothesis) over
resources: the parse accepts exactly the resources the action accepts, and never fails
another way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobfence.actions import ResourceValidator
from jobfence.actions.installed import get_action
from jobfence.errors import InvalidSpec, Unavailable
from jobfence.spec import parse_specs
from tests.support.factories import plugin_installed


@pytest.fixture
def tables() -> Iterator[Any]:
    with plugin_installed():
        import jobfence_test_actions as plugin

        plugin.RESOURCES_CHECKED.clear()
        yield plugin


def spec(resource: str | None = None, **kw: object) -> dict[str, object]:
    return {"actions": [{"name": "tables", "params": {}}], "resource": resource, **kw}


def test_the_hook_is_found_only_on_actions_that_define_it(tables: Any) -> None:
    assert isinstance(get_action("tables"), ResourceValidator)
    assert not isinstance(get_action("sleep"), ResourceValidator)
    assert not isinstance(get_action("shout"), ResourceValidator)


def test_a_known_table_passes_and_an_unknown_one_is_refused_naming_it(tables: Any) -> None:
    [ok] = parse_specs(spec("db.events"))
    assert ok.resource == "db.events"
    with pytest.raises(InvalidSpec) as refused:
        parse_specs(spec("db.nope"))
    assert str(refused.value) == ("spec: resource 'db.nope': action 'tables': table db.nope "
                                  "does not exist")
    with pytest.raises(InvalidSpec, match=r"^spec #1: no resource: action 'tables': a table "
                                          r"is required"):
        parse_specs([spec("db.users"), spec()])


def test_each_distinct_resource_is_checked_once_per_call(tables: Any) -> None:
    specs = [spec("db.events" if i % 2 else "db.users") for i in range(1000)]
    assert len(parse_specs(specs)) == 1000
    assert tables.RESOURCES_CHECKED == ["db.users", "db.events"]
    # Other params are another question to the action.
    parse_specs([spec("db.events"), {**spec("db.events"),
                                     "actions": [{"name": "tables", "params": {"v": 2}}]}])
    assert tables.RESOURCES_CHECKED[2:] == ["db.events", "db.events"]


def test_the_hook_runs_after_every_other_check(tables: Any) -> None:
    with pytest.raises(InvalidSpec, match="ttl"):
        parse_specs(spec("db.nope", ttl="soon"))
    with pytest.raises(InvalidSpec, match="idempotency key appears twice"):
        parse_specs([spec("db.nope", idempotency_key="k"), spec("db.x", idempotency_key="k")])
    assert tables.RESOURCES_CHECKED == []


def test_a_job_of_several_actions_asks_each_that_checks(tables: Any) -> None:
    both = {"actions": [{"name": "sleep", "params": {"seconds": 0}},
                        {"name": "tables", "params": {}}], "resource": "db.nope"}
    with pytest.raises(InvalidSpec, match="action 'tables'"):
        parse_specs(both)


def test_unavailable_is_passed_through_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    class Catalog:
        name = "catalog"

        def validate(self, params: Any) -> dict[str, Any]:
            return dict(params)

        def validate_resource(self, resource: str | None, params: Any) -> None:
            raise Unavailable("the catalog does not answer")

    monkeypatch.setattr("jobfence.spec.get_action", lambda name: Catalog())
    with pytest.raises(Unavailable, match="does not answer"):
        parse_specs({"actions": [{"name": "catalog"}], "resource": "db.events"})


RESOURCEISH = st.sampled_from(["db.events", "db.users", "db.nope", "DB.EVENTS", " db.events",
                               "db.events\n", ""]) | st.text(max_size=60) | st.none()


@settings(max_examples=200, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(RESOURCEISH, min_size=1, max_size=5))
def test_fuzzed_resources_pass_exactly_when_the_action_says(tables: Any,
                                                            resources: list[str | None]) -> None:
    try:
        parsed = parse_specs([spec(r) for r in resources])
    except InvalidSpec as exc:
        message = str(exc)
        bad = [i for i, r in enumerate(resources) if r not in tables.TABLES]
        shape = [i for i, r in enumerate(resources)
                 if r is not None and (not 1 <= len(r) <= 500 or "\x00" in r)]
        assert bad, message  # refused only when the action, or the spec's bounds, say so
        if not shape:
            assert message.startswith(f"spec #{bad[0]}: ") and "action 'tables'" in message
    else:
        assert [s.resource for s in parsed] == resources
        assert all(r in tables.TABLES for r in resources)
