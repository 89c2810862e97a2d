"""Every command and flag of the CLI, fuzzed (hypothesis, a fixed seed) against a real
database: whatever the arguments and the spec text, the command ends with a contract exit
code and at most one error line on stderr — never a traceback — and a command that refuses
its input writes nothing.

The CLI runs in this process (``jobfence.functions.cli.main``), so that a few hundred examples take
seconds; the acceptance tests run the same code as a subprocess."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.sqlconn import connect
from jobfence.functions import cli as entry
from tests.support.factories import plugin_installed

FUZZ = settings(max_examples=150, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

TEXT = st.text(st.characters(codec=None, categories=None), max_size=40)
NUMBERISH = st.sampled_from(["0", "-1", "1", "3", "1e999", "nan", "inf", "-inf", "99999999999",
                             "0.5", "", " ", "10001"]) | TEXT
DURATIONISH = st.sampled_from(["PT1S", "P999999Y", "P100Y", "P36501D", "PT0S", "-PT1H", "P",
                               "PT1.5H", "P1DT12H", "PT", "P1W2D"]) | TEXT
UUIDISH = st.uuids().map(str) | TEXT
QUEUEISH = st.sampled_from(["default", "datums", "a-b", "-a", "A", "a" * 63, "a" * 64, "a_b",
                            "a.b", ""]) | TEXT
TIMEISH = st.sampled_from(["2026-11-23T18:00:00Z", "2026-11-23T18:00:00+01:00",
                           "2026-11-23T18:00:00", "2026-13-01T00:00:00Z", "tomorrow",
                           "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "1970-01-01",
                           "2026-11-23 18:00:00Z", "2026-11-23T18:00:00.123456789Z"]) \
    | st.datetimes().map(lambda d: d.isoformat()) | TEXT
JOB_ID = "01900000-0000-7000-8000-000000000000"
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=12)


@pytest.fixture
def cli(dsn: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    monkeypatch.setenv("JOBFENCE_DATABASE_URL", dsn)
    monkeypatch.setenv("JOBFENCE_LOG_LEVEL", "error")
    for key in ("JOBFENCE_S3_BUCKET", "JOBFENCE_S3_ENDPOINT_URL", "JOBFENCE_CLUSTER"):
        monkeypatch.delenv(key, raising=False)
    conn = connect(dsn)

    def rows() -> tuple[int, ...]:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM jobs) AS a, (SELECT count(*) FROM job_events) AS b,"
            " (SELECT count(*) FROM job_dependencies) AS c,"
            " (SELECT draining::int FROM jobfence_control) AS d,"
            " (SELECT count(*) FROM queues) AS e,"
            " (SELECT count(*) FROM schedules) AS g,"
            " (SELECT count(*) FROM control_events) AS h,"
            " (SELECT coalesce(max(changed_at)::text, '') FROM queues) AS f").fetchone()
        assert row is not None
        return tuple(row.values())

    def run(argv: list[str], stdin: bytes = b"", allowed: frozenset[int] = frozenset(
            {0, 2, 3, 5})) -> int:
        before = rows()
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        code = entry.main(argv)
        _out, err = capsys.readouterr()
        assert code in allowed, (argv, code, err)
        assert "Traceback" not in err, err
        errors = [ln for ln in err.splitlines() if ln.startswith("jobfence: error:")]
        assert len(errors) <= 1, err
        if code != 0:
            assert len(errors) == 1, (argv, code, err)
            assert rows() == before, (argv, code, err)
        return code

    yield run
    conn.close()


def flags(*pairs: tuple[str, st.SearchStrategy[str]]) -> st.SearchStrategy[list[str]]:
    """Some of the flags, each with a value from its strategy, in any order."""
    return st.lists(st.sampled_from(pairs), max_size=4, unique_by=lambda p: p[0]).flatmap(
        lambda chosen: st.tuples(*[v for _, v in chosen]).map(
            lambda values, chosen=chosen: [x for (f, _), v in zip(chosen, values, strict=True)
                                           for x in (f, v)]))


ENQUEUE_FLAGS = flags(
    ("--resource", TEXT), ("--max-attempts", NUMBERISH), ("--priority", NUMBERISH),
    ("--after", UUIDISH), ("--idempotency-key", TEXT), ("--ttl", DURATIONISH),
    ("--timeout", DURATIONISH), ("--expires-in", DURATIONISH), ("--inputs", TEXT),
    ("--label", TEXT), ("--queue", QUEUEISH), ("--run-at", TIMEISH), ("--delay", DURATIONISH))
ACTION = st.sampled_from(['sleep:{"seconds": 0}', "sleep", "command", 'sleep:{"seconds": -1}',
                          'command:{"argv": ["true"]}', "nope", ":", "sleep:[", "sleep:1"]) \
    | TEXT | JSONISH.map(lambda v: "command:" + json.dumps(v))


@FUZZ
@given(st.lists(ACTION, min_size=0, max_size=3), ENQUEUE_FLAGS)
def test_enqueue_arguments(cli: Any, actions: list[str], extra: list[str]) -> None:
    cli(["enqueue", *actions, *extra])


@FUZZ
@given(st.sampled_from(["db.events", "db.users", "db.nope", "DB.events", ""]) | TEXT,
       st.sampled_from(["tables", 'tables:{"mode": 1}', "sleep"]))
def test_enqueue_with_an_action_that_checks_its_resource(cli: Any, resource: str,
                                                         action: str) -> None:
    """The test plugin's `tables` accepts db.events and db.users only: anything else is a
    refusal (exit 2) naming the action, and nothing is written (checked by ``cli``)."""
    with plugin_installed():
        code = cli(["enqueue", action, "--resource", resource])
    if action != "sleep" and resource not in ("db.events", "db.users"):
        assert code == 2


@FUZZ
@given(st.one_of(
    JSONISH.map(lambda v: json.dumps(v).encode()),
    st.lists(JSONISH, max_size=3).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=300),
    TEXT.map(lambda t: t.encode("utf-8", "surrogateescape")),
    st.fixed_dictionaries({"actions": st.lists(st.fixed_dictionaries(
        {"name": st.sampled_from(["sleep", "command"]), "params": JSONISH}), max_size=2)},
        optional={"ttl": DURATIONISH, "resource": JSONISH, "labels": JSONISH,
                  "after": JSONISH, "queue": QUEUEISH | JSONISH, "run_at": TIMEISH | JSONISH,
                  "delay": DURATIONISH | JSONISH}).map(lambda v: json.dumps(v).encode())))
def test_enqueue_spec_text(cli: Any, data: bytes) -> None:
    cli(["enqueue", "--spec", "-"], stdin=data)


@FUZZ
@given(UUIDISH, flags(("-o", st.sampled_from(["json", "text"]) | TEXT)),
       st.booleans())
def test_status(cli: Any, job_id: str, extra: list[str], events: bool) -> None:
    cli(["status", job_id, *extra, *(["--events"] if events else [])])


@FUZZ
@given(flags(("--status", st.sampled_from(["pending", "running", "done"]) | TEXT),
             ("--resource", TEXT), ("--parent", UUIDISH), ("--limit", NUMBERISH),
             ("--label", st.sampled_from(["team=data", "a=", "=b", "novalue"]) | TEXT),
             ("-o", st.sampled_from(["json", "text"]) | TEXT)))
def test_list(cli: Any, extra: list[str]) -> None:
    cli(["list", *extra])


@FUZZ
@given(UUIDISH, flags(("--reason", TEXT)))
def test_cancel(cli: Any, job_id: str, extra: list[str]) -> None:
    cli(["cancel", job_id, *extra])


@FUZZ
@given(flags(("--timeout", NUMBERISH), ("--interval", NUMBERISH)))
def test_wait(cli: Any, extra: list[str]) -> None:
    """A job that will not finish: wait either refuses its flags or times out (7)."""
    if any(f == "--timeout" for f in extra[::2]):
        i = extra.index("--timeout")
        if extra[i + 1] not in ("nan", "inf") and _float(extra[i + 1]) > 0.2:
            extra[i + 1] = "0.2"  # keep the run short
    cli(["wait", JOB_ID, *extra, "--timeout", "0"] if "--timeout" not in extra
        else ["wait", JOB_ID, *extra], allowed=frozenset({2, 5, 7}))


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return -1.0


FUNCTIONISH = st.sampled_from(["sweeper", "reconciliation", "lifecycle", "export-finalize",
                               "orphan-cleanup", "worker", "Sweeper", "", "-"]) | TEXT


@FUZZ
@given(flags(("--wait", FUNCTIONISH), ("--timeout", NUMBERISH), ("--interval", NUMBERISH),
             ("--function", FUNCTIONISH), ("--status", st.sampled_from(["failed", "x"])),
             ("--limit", NUMBERISH), ("-o", st.sampled_from(["json", "text"]) | TEXT)))
def test_runs(cli: Any, extra: list[str]) -> None:
    """Nothing runs meanwhile: a wait for a next success either refuses its flags or times
    out (7) — within a fifth of a second."""
    if "--wait" in extra[::2]:
        if "--timeout" not in extra[::2]:
            extra += ["--timeout", "0"]
        i = extra.index("--timeout")
        if extra[i + 1] not in ("nan", "inf") and _float(extra[i + 1]) > 0.2:
            extra[i + 1] = "0.2"
    cli(["runs", *extra], allowed=frozenset({0, 2, 7}))


@FUZZ
@given(st.sampled_from(["status", "STATUS", "on", ""]) | TEXT, flags(("--reason", TEXT)))
def test_drain(cli: Any, mode: str, extra: list[str]) -> None:
    if mode in ("on", "off"):
        mode = "status"  # switching drain is a write of its own; status and bad modes here
    cli(["drain", mode, *extra])


@FUZZ
@given(st.sampled_from(["sweeper", "reconciliation", "lifecycle", "export-finalize",
                        "orphan-cleanup"]),
       flags(("--batch-size", NUMBERISH)))
def test_periodic_functions(cli: Any, name: str, extra: list[str]) -> None:
    cli([name, *extra])


@FUZZ
@given(flags(("--max-jobs", NUMBERISH.filter(lambda t: not t.strip().isdigit())),
             ("--max-seconds", NUMBERISH.filter(lambda t: _float(t) <= 0)),
             ("--queue", QUEUEISH.filter(lambda t: not t.isascii() or not t.islower()))))
def test_worker_flags(cli: Any, extra: list[str]) -> None:
    """Bad budgets and queue names only: a good set would start a worker."""
    cli(["worker", *extra, "--max-jobs", "x"] if not extra else ["worker", *extra],
        allowed=frozenset({2}))


@FUZZ
@given(st.sampled_from(["status", "pause", "resume", "limit", "stop"]) | TEXT,
       st.lists(QUEUEISH | NUMBERISH | st.just("none"), max_size=3),
       flags(("-o", st.sampled_from(["json", "text"]) | TEXT), ("--reason", TEXT)))
def test_queue(cli: Any, verb: str, rest: list[str], extra: list[str]) -> None:
    cli(["queue", verb, *rest, *extra])


CRONISH = st.sampled_from(["* * * * *", "30 2 * * *", "0 0 30 2 *", "61 * * * *", "* * * *",
                           "0 0 * * * *", "*/0 * * * *", "0 0 L * *", "0 0 * * MON#5",
                           "0 0 29 2 *", "5-1 * * * *", "@daily", "", "* * * * 8"]) \
    | st.lists(st.sampled_from(["*", "*/5", "1-5", "0", "L", "MON", "JAN", "99", "?", "#",
                                "1,2", "-"]), min_size=0, max_size=7).map(" ".join) | TEXT
TZISH = st.sampled_from(["UTC", "Europe/Riga", "America/New_York", "Mars/Olympus", "",
                         "../../etc/passwd", "Etc/GMT+14", "utc", "posixrules", "/UTC",
                         "Europe/", "Europe//Riga"]) | TEXT
NAMEISH = QUEUEISH


@FUZZ
@given(NAMEISH, flags(("--cron", CRONISH), ("--timezone", TZISH),
                      ("-o", st.sampled_from(["json", "text"]) | TEXT)),
       st.one_of(st.just(b'{"actions": [{"name": "sleep", "params": {"seconds": 0}}]}'),
                 JSONISH.map(lambda v: json.dumps(v).encode()), st.binary(max_size=100)))
def test_schedule_add(cli: Any, name: str, extra: list[str], spec: bytes) -> None:
    """Whatever the name, the cron expression, the time zone or the spec: exit 0 (added),
    2 (refused: nothing written) or 3 (the name is taken)."""
    cli(["schedule", "add", name, *extra, "--spec", "-"], stdin=spec)


@FUZZ
@given(st.sampled_from(["list", "show", "pause", "resume", "delete", "stop"]) | TEXT,
       st.lists(NAMEISH, max_size=2), flags(("-o", st.sampled_from(["json", "text"]) | TEXT)))
def test_schedule_verbs(cli: Any, verb: str, rest: list[str], extra: list[str]) -> None:
    cli(["schedule", verb, *rest, *extra])


@FUZZ
@given(st.sampled_from(["retry", "cancel"]),
       flags(("--status", st.sampled_from(["failed", "cancelled", "pending", "running",
                                           "succeeded"]) | TEXT),
             ("--queue", QUEUEISH), ("--label", st.sampled_from(["a=b", "=b", "x"]) | TEXT),
             ("--resource", TEXT), ("--parent", UUIDISH), ("--before", TIMEISH | DURATIONISH),
             ("--after", TIMEISH | DURATIONISH), ("--limit", NUMBERISH),
             ("--reason", TEXT), ("-o", st.sampled_from(["json", "text"]) | TEXT)),
       st.booleans())
def test_bulk_retry_and_cancel(cli: Any, verb: str, extra: list[str], dry: bool) -> None:
    cli([verb, *extra, *(["--dry-run"] if dry else [])])


@FUZZ
@given(st.sampled_from(["bash", "zsh", "fish"]) | TEXT)
def test_completion(cli: Any, shell: str) -> None:
    cli(["completion", shell], allowed=frozenset({0, 2}))


@FUZZ
@given(st.lists(TEXT, max_size=3))
def test_unknown_commands_and_stray_arguments(cli: Any, argv: list[str]) -> None:
    if argv and argv[0] in entry.COMMANDS:
        argv = ["?", *argv]
    cli(argv, allowed=frozenset({0, 2}))
