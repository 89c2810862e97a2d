"""The schedules pass on the real store with an injected clock: each due tick is enqueued
exactly once — under passes racing each other and a manual run, across daylight-saving
changes in the schedule's time zone, after an outage (one missed tick caught up, never
more) — a tick whose resource is held is recorded as skipped, and nothing is enqueued while
draining or paused."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import jobfence.passes.schedules as schedules
from jobfence import db
from jobfence.passes.harness import Deps
from jobfence.schedules import Cron, job_template, schedule_spec
from jobfence.settings import Settings, load_settings
from jobfence.store import Store
from tests.support import Dsn

pytestmark = pytest.mark.pooled  # directly and through PgBouncer

SPEC = {"actions": [{"name": "command", "params": {"argv": ["true"],
                                                   "env": {"TOKEN": "s3cr3t"}}}]}


def settings(dsn: str, **kw: Any) -> Settings:
    return load_settings(database_url=dsn, **kw)


def add(store: Store, name: str, cron: str, first: datetime, tz: str = "UTC",
        spec: dict[str, Any] | None = None) -> None:
    """A schedule whose next tick is ``first`` (in the past: the database's clock must
    find every tick a test's pass asks for already due)."""
    parsed, shown = schedule_spec(spec or SPEC)
    store.schedules.add(name=name, cron=Cron.parse(cron, tz).expr, timezone=tz, spec=shown,
                        job=job_template(parsed, name, 3), next_tick_at=first, actor="test")


def run(store: Store, dsn: str, now: datetime, **kw: Any) -> schedules.Report:
    s = settings(dsn, **kw)
    return schedules.run_once(s, Deps(store, s, now=now))


def ticks(store: Store, name: str) -> list[tuple[datetime, str]]:
    rows = store.conn.execute(
        "SELECT t.tick_at, t.outcome FROM jobfence.schedule_ticks t "
        "JOIN jobfence.schedules s USING (schedule_id) WHERE s.name = %s ORDER BY tick_at",
        (name,)).fetchall()
    return [(r["tick_at"], r["outcome"]) for r in rows]


def jobs_of(store: Store, name: str) -> list[str]:
    rows = store.conn.execute(
        "SELECT idempotency_key FROM jobfence.jobs WHERE labels @> %s::jsonb ORDER BY 1",
        (f'{{"jobfence.io/schedule": "{name}"}}',)).fetchall()
    return [r["idempotency_key"] for r in rows]


def utc(*a: int) -> datetime:
    return datetime(*a, tzinfo=UTC)  # type: ignore[misc]


def test_a_due_tick_is_enqueued_once_with_its_key(store: Store, dsn: str) -> None:
    add(store, "nightly", "30 2 * * *", utc(2025, 1, 1, 2, 30))
    out = run(store, dsn, utc(2025, 1, 1, 2, 30, 5))
    assert (out.due, out.enqueued, out.caught_up) == (1, 1, 0)
    assert run(store, dsn, utc(2025, 1, 1, 2, 31)).due == 0
    assert jobs_of(store, "nightly") == ["schedule:nightly:2025-01-01T02:30:00Z"]
    row = store.schedules.get("nightly")
    assert row.next_tick_at == utc(2025, 1, 2, 2, 30)
    assert row.last_job_id is not None
    job = store.jobs.get(row.last_job_id)
    assert job is not None and job.status == "pending"
    assert job.actions[0]["params"]["env"] == {"TOKEN": "s3cr3t"}  # the job runs what was given


def test_a_ticks_job_is_in_the_schedules_group(store: Store, dsn: str) -> None:
    add(store, "tenant", "0 * * * *", utc(2025, 1, 1, 3), spec={**SPEC, "group": "acme"})
    assert run(store, dsn, utc(2025, 1, 1, 3, 0, 5)).enqueued == 1
    row = store.schedules.get("tenant")
    job = store.jobs.get(row.last_job_id) if row.last_job_id else None
    assert job is not None and job.group == "acme"


def test_racing_passes_and_a_manual_run_enqueue_each_tick_once(dsn: Dsn) -> None:
    """Three runs at once (two scheduled, one by hand), each on its own connection and with
    no lease between them: the database alone decides, every tick once."""
    with db.connect(dsn, pooler=dsn.pooler) as setup:
        store = Store(setup)
        for i in range(40):
            add(store, f"s{i}", "*/5 * * * *", utc(2025, 1, 1, 0, 0))
    now = utc(2025, 1, 1, 0, 1)
    start = threading.Barrier(3)
    reports: list[schedules.Report] = []

    def one(batch: int) -> None:
        with db.connect(dsn, pooler=dsn.pooler) as c:
            start.wait()
            reports.append(run(Store(c), dsn, now, batch_size=batch))

    threads = [threading.Thread(target=one, args=(b,)) for b in (7, 13, 40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.enqueued for r in reports) == 40
    with db.connect(dsn.direct) as c:
        rows = c.execute("SELECT idempotency_key, count(*) AS n FROM jobfence.jobs "
                         "GROUP BY 1").fetchall()
        assert len(rows) == 40 and all(r["n"] == 1 for r in rows)
        n = c.execute("SELECT count(*) AS n FROM jobfence.schedule_ticks").fetchone()
        assert n is not None and n["n"] == 40


def test_an_outage_of_three_ticks_catches_up_one(store: Store, dsn: str) -> None:
    add(store, "tenmin", "*/10 * * * *", utc(2025, 1, 1, 0, 10))
    out = run(store, dsn, utc(2025, 1, 1, 0, 35))  # 00:10, 00:20, 00:30 missed
    assert (out.enqueued, out.caught_up) == (1, 1)
    assert ticks(store, "tenmin") == [(utc(2025, 1, 1, 0, 30), "enqueued")]
    assert store.schedules.get("tenmin").next_tick_at == utc(2025, 1, 1, 0, 40)
    assert run(store, dsn, utc(2025, 1, 1, 0, 40)).enqueued == 1
    assert [t for t, _ in ticks(store, "tenmin")] == [utc(2025, 1, 1, 0, 30),
                                                      utc(2025, 1, 1, 0, 40)]


def passes(store: Store, dsn: str, start: datetime, end: datetime,
           every: timedelta = timedelta(minutes=15)) -> None:
    now = start
    while now <= end:
        run(store, dsn, now)
        now += every


def test_a_fixed_local_time_across_both_daylight_saving_changes(store: Store, dsn: str) -> None:
    """03:30 in Riga: in spring the clock jumps from 03:00 to 04:00 (03:30 never comes: the
    tick is the first minute after the gap, 04:00); in autumn 03:00-04:00 comes twice (one
    tick, the first). One job a day, never two, never none."""
    cron = Cron.parse("30 3 * * *", "Europe/Riga")
    add(store, "spring", cron.expr, utc(2025, 3, 28, 1, 30), tz="Europe/Riga")
    passes(store, dsn, utc(2025, 3, 28, 0, 0), utc(2025, 4, 1, 0, 0))
    assert [t for t, _ in ticks(store, "spring")] == [
        utc(2025, 3, 28, 1, 30), utc(2025, 3, 29, 1, 30),
        utc(2025, 3, 30, 1, 0),   # 04:00 EEST, right after the gap
        utc(2025, 3, 31, 0, 30)]
    assert len(jobs_of(store, "spring")) == 4
    store.schedules.delete(name="spring", actor="test")
    add(store, "autumn", cron.expr, utc(2025, 10, 25, 0, 30), tz="Europe/Riga")
    passes(store, dsn, utc(2025, 10, 25, 0, 0), utc(2025, 10, 28, 0, 0))
    assert [t for t, _ in ticks(store, "autumn")] == [
        utc(2025, 10, 25, 0, 30),
        utc(2025, 10, 26, 0, 30),  # 03:30 EEST, the first of the two 03:30s
        utc(2025, 10, 27, 1, 30)]
    assert len(jobs_of(store, "autumn")) == 3


def test_a_wildcard_hour_runs_by_the_clock_across_the_change(store: Store, dsn: str) -> None:
    add(store, "half", "*/30 * * * *", utc(2025, 10, 25, 23, 0), tz="Europe/Riga")
    passes(store, dsn, utc(2025, 10, 25, 23, 0), utc(2025, 10, 26, 3, 0),
           every=timedelta(minutes=5))
    got = [t for t, _ in ticks(store, "half")]
    assert got == [utc(2025, 10, 25, 23, 0) + timedelta(minutes=30 * i) for i in range(9)]


def test_a_tick_whose_resource_is_held_is_skipped(store: Store, dsn: str) -> None:
    add(store, "compact", "0 * * * *", utc(2025, 1, 1, 0, 0),
        spec={"actions": [{"name": "sleep", "params": {"seconds": 1}}],
              "resource": "db.events"})
    assert run(store, dsn, utc(2025, 1, 1, 0, 0, 1)).enqueued == 1
    out = run(store, dsn, utc(2025, 1, 1, 1, 0, 1))  # the first job has not run yet
    assert (out.enqueued, out.resource_busy) == (0, 1)
    assert [o for _, o in ticks(store, "compact")] == ["enqueued", "resource_busy"]


def test_nothing_while_draining_then_the_latest_tick(store: Store, dsn: str) -> None:
    add(store, "hourly", "0 * * * *", utc(2025, 1, 1, 0, 0))
    store.control.set_drain(on=True, reason="upgrade", actor="test")
    assert run(store, dsn, utc(2025, 1, 1, 0, 1)).draining == 1
    assert run(store, dsn, utc(2025, 1, 1, 3, 1)).enqueued == 0
    store.control.set_drain(on=False, reason="done", actor="test")
    out = run(store, dsn, utc(2025, 1, 1, 3, 2))
    assert (out.enqueued, out.caught_up) == (1, 1)
    assert ticks(store, "hourly") == [(utc(2025, 1, 1, 3, 0), "enqueued")]


def test_a_paused_schedule_enqueues_nothing_and_resumes_from_now(store: Store,
                                                                 dsn: str) -> None:
    add(store, "p", "0 * * * *", utc(2025, 1, 1, 0, 0))
    store.schedules.set_paused(name="p", paused=True, next_tick_at=None, actor="test")
    assert run(store, dsn, utc(2025, 1, 1, 5, 0)).due == 0
    resumed = store.schedules.set_paused(name="p", paused=False,
                                         next_tick_at=utc(2025, 1, 1, 6, 0), actor="test")
    assert resumed.next_tick_at == utc(2025, 1, 1, 6, 0)
    assert run(store, dsn, utc(2025, 1, 1, 6, 0, 30)).enqueued == 1
    events = store.conn.execute("SELECT action FROM jobfence.control_events "
                                "WHERE subject = 'p' ORDER BY event_id").fetchall()
    assert [e["action"] for e in events] == ["schedule_add", "schedule_pause",
                                             "schedule_resume"]


def test_a_tick_not_due_by_the_databases_clock_is_refused(store: Store, dsn: str) -> None:
    """A pass whose clock runs ahead (or a hostile login) cannot enqueue the future."""
    future = datetime.now(UTC) + timedelta(days=2)
    add(store, "ahead", "0 * * * *", future.replace(minute=0, second=0, microsecond=0))
    out = run(store, dsn, future + timedelta(hours=1))
    assert (out.enqueued, out.raced) == (0, 1)
    assert ticks(store, "ahead") == []


def test_recorded_ticks_go_with_the_function_runs_retention(store: Store, dsn: str) -> None:
    """The record of ticks is history (lifecycle deletes it after
    JOBFENCE_FUNCTION_RUNS_RETENTION); the schedule's next tick, not the record, keeps
    every tick once."""
    import jobfence.passes.lifecycle as lifecycle

    add(store, "old", "0 * * * *", utc(2025, 1, 1, 0, 0))
    run(store, dsn, utc(2025, 1, 1, 0, 1))
    run(store, dsn, utc(2025, 1, 1, 1, 1))
    store.conn.execute("UPDATE jobfence.schedule_ticks SET at = now() - interval '40 days' "
                       "WHERE tick_at = %s", (utc(2025, 1, 1, 0, 0),))
    s = settings(dsn)
    report = lifecycle.run_once(s, Deps(store, s))
    assert report.schedule_ticks_deleted == 1
    assert [t for t, _ in ticks(store, "old")] == [utc(2025, 1, 1, 1, 0)]
    assert run(store, dsn, utc(2025, 1, 1, 1, 30)).enqueued == 0


def test_add_and_resume_date_the_first_tick_by_the_databases_clock(
        store: Store, dsn: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`schedule add` and `resume` run on an operator's machine, whose clock may be a year
    off: the first tick is the one after the database's now, as every tick after it."""
    import json

    import jobfence.functions.schedule as command

    class Skewed(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Skewed:  # type: ignore[override]
            return cls(2031, 6, 1, tzinfo=UTC)

    monkeypatch.setattr(command, "datetime", Skewed, raising=False)
    monkeypatch.setattr("jobfence.schedules.datetime", Skewed)
    monkeypatch.setenv("JOBFENCE_DATABASE_URL", dsn)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    assert command.main(["add", "skew", "--cron", "0 * * * *", "--spec", str(spec)]) == 0
    now = store.schedules.clock()
    first = store.schedules.get("skew").next_tick_at
    assert now < first <= now + timedelta(hours=1), (now, first)
    assert command.main(["pause", "skew"]) == 0
    assert command.main(["resume", "skew"]) == 0
    resumed = store.schedules.get("skew").next_tick_at
    assert now < resumed <= store.schedules.clock() + timedelta(hours=1), (now, resumed)


# What `schedule add` stores, and what the database refuses to store or run -------------

FULL_SPEC = {"actions": [{"name": "command", "params": {"argv": ["true"]},
                          "inactivity_timeout": "PT5M"},
                         {"name": "sleep", "params": {"seconds": 1}}],
             "resource": "db.events", "max_attempts": 7, "priority": -3, "ttl": "P7D",
             "timeout": "PT1H30M", "inactivity_timeout": "PT10M", "expires_in": "PT2H",
             "delay": "PT0.5S", "labels": {"team": "data"}, "queue": "reports",
             "group": "team-data"}


def _made(name: str, spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    parsed, shown = schedule_spec(spec)
    return shown, job_template(parsed, name, 3)


def _add_as(url: str, name: str, shown: Any, job: Any, cron: str = "0 * * * *",
            tz: str = "UTC") -> None:
    import json

    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT * FROM jobfence.operator_schedule_add(%s, %s, %s, %s::jsonb, "
                  "%s::jsonb, now(), 'someone')",
                  (name, cron, tz, json.dumps(shown), json.dumps(job)))


def test_the_database_keeps_a_schedule_exactly_as_schedule_add_makes_it(dsn: Dsn) -> None:
    """The operator's own login, calling operator_schedule_add itself: what the CLI makes of
    a spec is stored; a job that runs another command than the spec shows, or a template
    the pass could not read, is refused (check_violation) and nothing is written."""
    import psycopg

    from devtools.roles import ensure_logins

    operator = ensure_logins(dsn.direct)["operator"]
    for name, spec in (("plain", SPEC), ("full", FULL_SPEC)):
        _add_as(operator, name, *_made(name, spec))
    shown, job = _made("forged", SPEC)
    hidden = {**job, "actions": [{"name": "command", "params": {"argv": ["rm", "-rf", "/"]}}]}
    forged = {
        "another command": (shown, hidden),
        "another action's params": (shown, {**job, "actions": [{**job["actions"][0],
                                                                "params": {"argv": ["id"]}}]}),
        "an extra action": (shown, {**job, "actions": job["actions"] * 2}),
        "a priority not a number": (shown, {**job, "priority": "x"}),
        "a fractional priority": (shown, {**job, "priority": 1.5}),
        "attempts out of bounds": (shown, {**job, "max_attempts": 0}),
        "a queue not a name": (shown, {**job, "queue": "No Queue"}),
        "another queue": (shown, {**job, "queue": "other"}),
        "another resource": (shown, {**job, "resource": "db.other"}),
        "labels without the schedule's": (shown, {**job, "labels": {}}),
        "a timeout the spec has not": (shown, {**job, "timeout_seconds": 60}),
        "a field the template has not": (shown, {**job, "status": "running"}),
        "a field missing": (shown, {k: v for k, v in job.items() if k != "spec_hash"}),
        "not an object": (shown, ["x"]),
        "a spec field schedules refuse": ({**shown, "after": ["x"]}, job),
        "a spec not an object": ("x", job),
        "a group the spec has not": (shown, {**job, "group_key": "team-data"}),
    }
    for what, (s, j) in forged.items():
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            _add_as(operator, "forged", s, j)
        assert refused.value.diag.constraint_name == "schedules_as_the_cli_stores", what
    full_shown, full_job = _made("full", FULL_SPEC)
    for what, j in (("another ttl", {**full_job, "ttl_seconds": 60.0}),
                    ("another inactivity timeout", {**full_job, "actions": [
                        {**full_job["actions"][0], "inactivity_timeout": "PT1S"},
                        full_job["actions"][1]]}),
                    ("expiry before its delay", {**full_job, "expires_in_seconds": 0.25}),
                    ("another group", {**full_job, "group_key": "team-web"}),
                    ("a group not a group", {**full_job, "group_key": "team data"}),
                    ("no group", {k: v for k, v in full_job.items() if k != "group_key"})):
        with pytest.raises(psycopg.errors.CheckViolation):
            _add_as(operator, "forged", full_shown, j)
    for cron, tz in (("* * * *", "UTC"), ("0 * * * * *", "UTC"), ("0 * * * *", "Mars/Base")):
        with pytest.raises(psycopg.errors.CheckViolation):
            _add_as(operator, "forged", shown, {**job, "labels": {
                "jobfence.io/schedule": "forged"}}, cron, tz)
    with psycopg.connect(dsn.direct) as c:
        names = [r[0] for r in c.execute("SELECT name FROM jobfence.schedules ORDER BY 1")]
        added = c.execute("SELECT count(*) FROM jobfence.control_events "
                          "WHERE action = 'schedule_add'").fetchone()
    assert names == ["full", "plain"] and added == (2,)


def test_a_schedule_stored_malformed_is_skipped_and_the_others_fire(store: Store, dsn: str,
                                                                     conn: Any) -> None:
    """Rows stored before the database judged them (or by its owner): each is counted,
    logged and its tick recorded invalid, moved on to its next tick — and every other
    schedule of the pass fires."""
    import json

    add(store, "good", "0 * * * *", utc(2025, 1, 1, 0, 0))
    shown, job = _made("bad", SPEC)
    for name, stored in (("bad-type", {**job, "priority": "high"}),
                         ("bad-shape", "not a template"),
                         ("bad-hidden", {**job, "actions": [
                             {"name": "command", "params": {"argv": ["rm", "-rf", "/"]}}]})):
        conn.execute("INSERT INTO jobfence.schedules (name, cron, timezone, spec, job, "
                     "next_tick_at) VALUES (%s, '0 * * * *', 'UTC', %s, %s, %s)",
                     (name, json.dumps(shown), json.dumps(stored), utc(2025, 1, 1, 0, 0)))
    out = run(store, dsn, utc(2025, 1, 1, 0, 1))
    assert (out.due, out.enqueued, out.invalid) == (4, 1, 3)
    assert jobs_of(store, "good") == ["schedule:good:2025-01-01T00:00:00Z"]
    for name in ("bad-type", "bad-shape", "bad-hidden"):
        assert ticks(store, name) == [(utc(2025, 1, 1, 0, 0), "invalid")]
        assert store.schedules.get(name).next_tick_at == utc(2025, 1, 1, 1, 0)
    assert conn.execute("SELECT count(*) AS n FROM jobfence.jobs").fetchone()["n"] == 1
    out = run(store, dsn, utc(2025, 1, 1, 1, 1))
    assert (out.enqueued, out.invalid) == (1, 3)
