"""Groups (tenants) within a queue, on a real PostgreSQL: round-robin claims serve a small
group that arrived late within one round of claims, one group's backlog in the way or not;
a limit on each group's running jobs holds under a race of many claimers, fair or not
(judged from the audit trail); the jobs without a group are one group; the KEDA query
counts a group's ready work only up to its room; the group a job may have is the same to
the client and to the database, whatever the text."""

from __future__ import annotations

from collections import Counter
from uuid import UUID

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.audit import group_limit_violations, most_running_in_group
from jobfence.errors import InvalidSpec
from jobfence.limits import GROUP_KEY
from jobfence.store import Claim, Store
from tests.support.factories import new_job
from tests.support.races import drain_racing

pytestmark = pytest.mark.pooled  # directly and through PgBouncer


def groups_of(store: Store, claims: list[Claim]) -> list[str | None]:
    rows = store.conn.execute(
        "SELECT job_id, group_key FROM jobfence.jobs WHERE job_id = ANY(%s)",
        ([c.job_id for c in claims],)).fetchall()
    group = {r["job_id"]: r["group_key"] for r in rows}
    return [group[c.job_id] for c in claims]


def claim(store: Store, queue: str, limit: int = 1) -> list[Claim]:
    return store.attempts.claim(worker_id="w", lease_seconds=60, queue=queue, limit=limit)


def finish(store: Store, claims: list[Claim]) -> None:
    for c in claims:
        assert store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id,
                                     succeeded=True) is not None


# -- round-robin ----------------------------------------------------------------------------

@pytest.mark.parametrize("fair", [True, False])
def test_a_late_small_group_starts_within_one_round_when_fair(store: Store,
                                                               fair: bool) -> None:
    """A tenant's 200 jobs queued first, another's 5 after them, one claim at a time (a
    one-job-per-pod pool): with round-robin on, the second tenant's jobs go every other
    claim; without it, after the whole backlog."""
    store.queues.set_groups("shared", fair=fair)
    store.jobs.enqueue([new_job(queue="shared", group_key="bulk") for _ in range(200)])
    store.jobs.enqueue([new_job(queue="shared", group_key="late") for _ in range(5)])
    order = []
    while claims := claim(store, "shared"):
        order += groups_of(store, claims)
        finish(store, claims)
    assert Counter(order) == {"bulk": 200, "late": 5}
    late = [i for i, g in enumerate(order) if g == "late"]
    assert late == ([1, 3, 5, 7, 9] if fair else [200, 201, 202, 203, 204])


def test_a_fair_batch_takes_a_job_of_each_group_in_turn(store: Store) -> None:
    """Ten at once (a draining pool): a round over the three groups, then the next round,
    priority order within each group; the next claim goes on from the group after the last
    one served."""
    store.queues.set_groups("q", fair=True)
    jobs = [new_job(queue="q", group_key=g, priority=p) for g in ("a", "b") for p in range(20)]
    store.jobs.enqueue(jobs)
    store.jobs.enqueue([new_job(queue="q", group_key="c") for _ in range(2)])
    first = claim(store, "q", limit=10)
    assert Counter(groups_of(store, first)) == {"a": 4, "b": 4, "c": 2}
    priority = {j.job_id: (j.group_key, j.priority) for j in jobs}
    assert sorted(priority[c.job_id] for c in first if c.job_id in priority) == [
        (g, p) for g in ("a", "b") for p in (16, 17, 18, 19)]  # highest priority first
    # The last served was b (a, b, c, a, b, c, a, b, a, b); c has nothing left: a, b, a.
    assert Counter(groups_of(store, claim(store, "q", limit=3))) == {"a": 2, "b": 1}


def test_jobs_without_a_group_are_one_group_of_their_own(store: Store) -> None:
    store.queues.set_groups("q", fair=True)
    store.queues.set_groups("q", group_limit=2, set_group_limit=True)
    store.jobs.enqueue([new_job(queue="q") for _ in range(5)])
    store.jobs.enqueue([new_job(queue="q", group_key="t1") for _ in range(5)])
    assert sorted(groups_of(store, claim(store, "q", limit=10)), key=str) == \
        [None, None, "t1", "t1"]
    assert claim(store, "q", limit=10) == []
    [g_none, g_t1] = sorted(store.queues.groups("q"), key=lambda g: str(g.group))
    assert (g_none.group, g_none.pending, g_none.running) == (None, 3, 2)
    assert (g_t1.group, g_t1.pending, g_t1.running) == ("t1", 3, 2)


# -- limits on each group -------------------------------------------------------------------

def test_a_group_at_its_limit_waits_and_the_others_go_on(store: Store) -> None:
    """Not fair: the queue's own order across the groups, each only up to its room; a
    lowered limit lets the running jobs finish and holds the group's claims until it has
    room again."""
    store.queues.set_groups("q", group_limit=3, set_group_limit=True)
    store.jobs.enqueue([new_job(queue="q", group_key="big", priority=5) for _ in range(10)])
    store.jobs.enqueue([new_job(queue="q", group_key="small") for _ in range(10)])
    got = claim(store, "q", limit=5)
    assert Counter(groups_of(store, got)) == {"big": 3, "small": 2}
    store.queues.set_groups("q", group_limit=1, set_group_limit=True)
    assert claim(store, "q", limit=5) == []  # both groups past their new limit
    finish(store, [c for c, g in zip(got, groups_of(store, got), strict=True) if g == "big"])
    assert groups_of(store, claim(store, "q", limit=5)) == ["big"]
    store.queues.set_groups("q", group_limit=None, set_group_limit=True)
    assert Counter(groups_of(store, claim(store, "q", limit=20))) == {"big": 6, "small": 8}


def test_a_group_at_its_limit_at_the_front_of_the_queue_is_passed(store: Store) -> None:
    """Not fair, each group limited to one running job: a tenant's 200 jobs ahead of the
    queue hold its first looks; the claim goes past them, to the others' jobs."""
    store.queues.set_groups("q", group_limit=1, set_group_limit=True)
    store.jobs.enqueue([new_job(queue="q", group_key="bulk") for _ in range(200)])
    store.jobs.enqueue([new_job(queue="q", group_key=f"t{i}") for i in range(3)])
    first = claim(store, "q", limit=1)
    assert groups_of(store, first) == ["bulk"]
    assert sorted(groups_of(store, claim(store, "q", limit=10)), key=str) == ["t0", "t1", "t2"]
    assert claim(store, "q", limit=10) == []  # every group at its limit
    finish(store, first)
    assert groups_of(store, claim(store, "q", limit=10)) == ["bulk"]


@pytest.mark.parametrize("fair", [True, False])
def test_a_cancelled_attempt_still_stopping_holds_its_groups_slot(store: Store,
                                                                  fair: bool) -> None:
    """Until its worker confirms the command gone, a cancelled attempt keeps its group's
    slot, as it keeps the queue's (invariant 12): the group's next job waits."""
    store.queues.set_groups("q", group_limit=1, set_group_limit=True, fair=fair)
    store.jobs.enqueue([new_job(queue="q", group_key="t") for _ in range(2)])
    [running] = claim(store, "q")
    store.jobs.cancel(job_id=running.job_id, reason="wrong input")
    assert claim(store, "q", limit=10) == []
    assert store.attempts.stopped(job_id=running.job_id, attempt_id=running.attempt_id)
    assert len(claim(store, "q", limit=10)) == 1


THREADS = 16
GROUP_LIMIT = 2


@pytest.mark.parametrize("fair", [True, False])
def test_sixteen_claimers_never_run_more_of_a_group_than_its_limit(
        dsn: str, store: Store, fair: bool) -> None:
    """Sixteen threads, each on its own connection, released at once and claiming in a
    loop — single claims and batches, holding each job a random moment — until every job
    of four groups (one of them the jobs without a group) is done. From the audit trail:
    never more than two claims of a group open at once, and two were in each group (the
    limit was contested), fair or not."""
    store.queues.set_groups("tenants", group_limit=GROUP_LIMIT, set_group_limit=True,
                            fair=fair)
    groups: list[str | None] = ["acme", "globex", "initech", None]
    store.jobs.enqueue([new_job(queue="tenants", group_key=g)
                        for _ in range(25) for g in groups])
    total = 25 * len(groups)
    assert drain_racing(dsn, "tenants", threads=THREADS, batches=(1, 1, 3, 10),
                        most=GROUP_LIMIT * len(groups)) == total
    assert group_limit_violations(store.conn) == []
    assert [most_running_in_group(store.conn, "tenants", g) for g in groups] == \
        [GROUP_LIMIT] * len(groups)


def test_the_audit_check_sees_a_group_limit_broken_behind_the_claims_back(
        store: Store) -> None:
    """The judge of the race above finds a violation when there is one."""
    store.jobs.enqueue([new_job(queue="q", group_key="t") for _ in range(3)])
    assert len(claim(store, "q", limit=3)) == 3
    store.queues.set_groups("q", group_limit=2, set_group_limit=True)  # lowered under them
    assert group_limit_violations(store.conn)
    assert most_running_in_group(store.conn, "q", "t") == 3


def test_the_scaler_counts_each_groups_ready_work_up_to_its_room(store: Store) -> None:
    """What KEDA reads: running jobs, and each group's ready jobs only as far as the group
    could start them — one group's backlog never asks for pods that could not claim."""
    store.jobs.enqueue([new_job(queue="q", group_key="big") for _ in range(50)])
    store.jobs.enqueue([new_job(queue="q", group_key="small") for _ in range(2)])
    store.jobs.enqueue([new_job(queue="q")])
    assert store.queues.scaler_value("q") == 53
    store.queues.set_groups("q", group_limit=4, set_group_limit=True)
    assert store.queues.scaler_value("q") == 4 + 2 + 1
    running = claim(store, "q", limit=10)
    assert Counter(groups_of(store, running)) == {"big": 4, "small": 2, None: 1}
    assert store.queues.scaler_value("q") == 7  # every group at its limit or empty
    finish(store, [c for c, g in zip(running, groups_of(store, running), strict=True)
                   if g == "big"][:1])
    assert store.queues.scaler_value("q") == 7  # a slot free again, and work for it
    store.queues.configure("q", limit=5, set_limit=True)
    assert store.queues.scaler_value("q") == 5  # the queue's limit caps it all


def test_settings_are_audited_and_shown(store: Store) -> None:
    store.queues.set_groups("q", group_limit=3, set_group_limit=True, actor="alice")
    store.queues.set_groups("q", fair=True, actor="bob")
    [q] = store.queues.status("q")
    assert (q.group_limit, q.fair, q.limit) == (3, True, None)
    events = store.conn.execute(
        "SELECT actor, action, detail FROM jobfence.control_events WHERE subject = 'q' "
        "ORDER BY event_id").fetchall()
    assert [(e["actor"], e["action"], e["detail"]) for e in events] == [
        ("alice", "queue_group_limit", {"group_limit": 3}),
        ("bob", "queue_fair", {"fair": True})]
    with pytest.raises(InvalidSpec, match="group limit must be between 0 and 1000000"):
        store.queues.set_groups("q", group_limit=-1, set_group_limit=True)


# -- what a group may be --------------------------------------------------------------------

@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.text(max_size=140),
                 st.from_regex(r"[A-Za-z0-9][-A-Za-z0-9_.:@/]{0,130}", fullmatch=True)))
def test_the_client_and_the_database_agree_on_what_a_group_is(conn: psycopg.Connection,
                                                              text: str) -> None:
    """Whatever the text: a group the spec's check lets through the database stores, and
    one it refuses the database refuses too (its own check: a login that skips the
    client writes nothing the client would not)."""
    job = new_job(queue="q", group_key=text)
    stored: UUID | None
    try:
        with conn.transaction(force_rollback=True):
            [made] = Store(conn).jobs.enqueue([job])
            stored = made.job_id
    except InvalidSpec:  # the database's refusal, as the store says it
        stored = None
    assert (stored is not None) == bool(GROUP_KEY.fullmatch(text)), repr(text)


def test_the_metrics_show_each_groups_jobs_and_the_settings(store: Store) -> None:
    from jobfence.metrics import StoreCollector

    store.jobs.enqueue([new_job(queue="q", group_key="acme") for _ in range(3)])
    store.jobs.enqueue([new_job(queue="q")])
    store.jobs.enqueue([new_job(queue="plain", group_key="acme")])  # no group settings
    store.queues.set_groups("q", group_limit=2, set_group_limit=True)
    claim(store, "q", limit=10)

    def samples() -> dict[tuple[str, tuple[str, ...]], float]:
        return {(s.name, tuple(s.labels.values())): s.value  # in the labels' order
                for m in StoreCollector(store, runs=False).collect() for s in m.samples}

    got = samples()
    assert got["jobfence_group_jobs", ("q", "acme", "pending")] == 1
    assert got["jobfence_group_jobs", ("q", "acme", "running")] == 2
    assert got["jobfence_group_jobs", ("q", "", "running")] == 1
    assert got["jobfence_queue_group_limit", ("q",)] == 2
    assert got["jobfence_queue_fair", ("q",)] == 0
    assert not [k for k in got if k[0] == "jobfence_group_jobs" and "plain" in k[1]]
    store.queues.set_groups("q", fair=True)
    assert samples()["jobfence_queue_fair", ("q",)] == 1
