"""The invariants a chaos run is judged by, read from the database's audit trail and the
object store — never from what the workers said about themselves.

Each check is one SQL statement returning its violations (at most a few examples each), so
a run of thousands of jobs is judged in a second.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.audit import group_limit_violations, queue_limit_violations
from jobfence.db import Connection
from jobfence.objectstore import ObjectStore, parse_s3_url

# Each claim's fence window: from its claim event to the next event of the job (the
# transition that ended the claim: a terminal write, a release, or a rotation).
WINDOWS = """
WITH ev AS (
    SELECT e.*, lead(e.at) OVER w AS next_at, lead(e.event_id) OVER w AS next_id
    FROM job_events e
    WINDOW w AS (PARTITION BY e.job_id ORDER BY e.event_id)
)
SELECT job_id, attempt_id, at AS claimed_at, next_at AS ended_at
FROM ev WHERE to_status = 'running' AND attempt_id IS NOT NULL
"""

CHECKS: dict[str, str] = {
    "every job is terminal (nothing lost, nothing stuck)": """
        SELECT job_id, status FROM jobs
        WHERE status IN ('waiting', 'pending', 'running') LIMIT 5""",
    "exactly one terminal transition per job": """
        SELECT j.job_id, count(e.event_id) AS terminal_events FROM jobs j
        LEFT JOIN job_events e ON e.job_id = j.job_id
            AND e.to_status IN ('succeeded', 'failed', 'cancelled')
        GROUP BY j.job_id HAVING count(e.event_id) <> 1 LIMIT 5""",
    "no transition after the terminal one": """
        SELECT t.job_id, e.from_status, e.to_status FROM job_events t
        JOIN job_events e ON e.job_id = t.job_id AND e.event_id > t.event_id
        WHERE t.to_status IN ('succeeded', 'failed', 'cancelled') LIMIT 5""",
    "every move out of running names the claim that held the fence": """
        WITH ev AS (
            SELECT e.*, lag(e.to_status) OVER w AS prev_to, lag(e.attempt_id) OVER w AS prev_att
            FROM job_events e WINDOW w AS (PARTITION BY e.job_id ORDER BY e.event_id))
        SELECT job_id, attempt_id, prev_att FROM ev
        WHERE from_status = 'running' AND prev_to = 'running'
          AND attempt_id IS DISTINCT FROM prev_att LIMIT 5""",
    "a succeeded job's result was written by its last claim": """
        SELECT j.job_id FROM jobs j
        WHERE j.status = 'succeeded' AND NOT j.is_parent AND j.attempt_id IS DISTINCT FROM (
            SELECT e.attempt_id FROM job_events e WHERE e.job_id = j.job_id
              AND e.to_status = 'running' ORDER BY e.event_id DESC LIMIT 1) LIMIT 5""",
    "no action result written outside its attempt's fence window": f"""
        WITH w AS ({WINDOWS})
        SELECT r.job_id, r.attempt_id, r.action_index FROM job_action_results r
        LEFT JOIN w ON w.job_id = r.job_id AND w.attempt_id = r.attempt_id
        WHERE w.job_id IS NULL OR r.finished_at < w.claimed_at
           OR (w.ended_at IS NOT NULL AND r.finished_at > w.ended_at) LIMIT 5""",
    "no output registered or confirmed outside its attempt's fence window": f"""
        WITH w AS ({WINDOWS})
        SELECT o.job_id, o.attempt_id, o.path FROM job_outputs o
        LEFT JOIN w ON w.job_id = o.job_id AND w.attempt_id = o.attempt_id
        WHERE w.job_id IS NULL OR o.created_at < w.claimed_at
           OR (w.ended_at IS NOT NULL AND o.updated_at > w.ended_at) LIMIT 5""",
    "attempt_count never exceeds max_attempts, and counts the claims not given back": """
        WITH c AS (
            SELECT j.job_id, j.attempt_count, j.max_attempts, j.interruptions,
                (SELECT count(*) FROM job_events e WHERE e.job_id = j.job_id
                   AND e.to_status = 'running' AND e.attempt_id IS NOT NULL) AS claims,
                -- SIGTERM gives an attempt back (up to JOBFENCE_MAX_INTERRUPTIONS)
                (SELECT count(*) FROM job_events e WHERE e.job_id = j.job_id
                   AND e.from_status = 'running' AND e.to_status = 'pending'
                   AND e.reason = 'worker received SIGTERM') AS given_back,
                -- a claim whose answer was lost gives its jobs back unspent
                (SELECT count(*) FROM job_events e WHERE e.job_id = j.job_id
                   AND e.from_status = 'running' AND e.to_status = 'pending'
                   AND e.reason LIKE 'given back by %: the answer to its claim was lost')
                   AS unanswered
            FROM jobs j WHERE NOT j.is_parent)
        SELECT * FROM c WHERE attempt_count > max_attempts
            OR attempt_count <> claims - least(given_back, interruptions) - unanswered
        LIMIT 5""",
    "never two active jobs on one resource": """
        WITH life AS (
            SELECT j.job_id, j.resource,
                (SELECT min(e.at) FROM job_events e WHERE e.job_id = j.job_id) AS born,
                (SELECT min(e.at) FROM job_events e WHERE e.job_id = j.job_id
                   AND e.to_status IN ('succeeded', 'failed', 'cancelled')) AS died
            FROM jobs j WHERE j.resource IS NOT NULL)
        SELECT a.resource, a.job_id, b.job_id FROM life a JOIN life b
          ON a.resource = b.resource AND a.job_id < b.job_id
         AND a.born < coalesce(b.died, 'infinity') AND b.born < coalesce(a.died, 'infinity')
        LIMIT 5""",
    # A parent an operator cancelled may have had every child succeed already (between its
    # last child and its finalization); it must only leave no child unfinished.
    "a finalized parent's counts match its children": """
        SELECT p.job_id FROM jobs p WHERE p.is_parent AND (
            (p.status IN ('succeeded', 'failed')
             AND (p.status = 'succeeded') <> NOT EXISTS (SELECT 1 FROM jobs c
                 WHERE c.parent_id = p.job_id AND c.status <> 'succeeded'))
            OR (p.status = 'cancelled'
                AND EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = p.job_id
                            AND c.status NOT IN ('succeeded', 'failed', 'cancelled'))))
        LIMIT 5""",
}


@dataclass
class Verdict:
    name: str
    violations: list[Any] = field(default_factory=list)
    checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations


def check_database(conn: Connection) -> list[Verdict]:
    out = []
    for name, sql in CHECKS.items():
        rows = conn.execute(sql).fetchall()  # type: ignore[call-overload]
        out.append(Verdict(name, [dict(r) for r in rows]))
    out.append(Verdict("a queue's limit on running jobs is never exceeded (invariant 10)",
                       queue_limit_violations(conn)))
    out.append(Verdict("a queue's limit on each group's running jobs is never exceeded",
                       group_limit_violations(conn)))
    return out


def check_manifests(conn: Connection, objects: Callable[[], ObjectStore]) -> Verdict:
    """Every output a manifest lists is a committed one: the child succeeded and the output
    belongs to the attempt that won its terminal write."""
    v = Verdict("no committed output from a losing attempt (manifests)")
    winners = {str(r["job_id"]): (r["status"], str(r["attempt_id"])) for r in conn.execute(
        "SELECT job_id, status, attempt_id FROM jobs WHERE parent_id IS NOT NULL")}
    for row in conn.execute("SELECT job_id, manifest FROM jobs WHERE is_parent "
                            "AND manifest IS NOT NULL"):
        manifest = json.loads(objects().get_bytes(*parse_s3_url(row["manifest"])))
        for item in manifest["items"]:
            status, attempt = winners.get(item["job_id"], ("missing", ""))
            for url in item["outputs"]:
                v.checked += 1
                if status != "succeeded" or f"/{item['job_id']}/{attempt}/" not in url:
                    v.violations.append({"child": item["job_id"], "output": url,
                                         "child_status": status})
    return v


def check_handed(conn: Connection) -> Verdict:
    """Every file a workflow step was handed (its inputs' ``files``: a step's, or a
    fan-out's datum's) is a committed output: of a job that succeeded, uploaded by the
    attempt that won its terminal write, or by an earlier attempt of its run that
    finished an action (a resumed run's) — never a fenced-out or failed attempt's."""
    v = Verdict("no file handed on from a losing attempt (workflow steps)")
    rows = conn.execute("""
        SELECT t.job_id AS taker, f ->> 'url' AS url, o.job_id AS producer,
               o.attempt_id, o.status AS upload, p.status, p.attempt_id AS won,
               EXISTS (SELECT FROM job_action_results r
                       WHERE r.job_id = p.job_id AND r.attempt_id = o.attempt_id
                         AND r.status = 'succeeded' AND r.run = p.run) AS resumed_from
        FROM jobs t CROSS JOIN LATERAL jsonb_array_elements(t.inputs -> 'files') f
        LEFT JOIN job_outputs o ON o.url = f ->> 'url'
        LEFT JOIN jobs p ON p.job_id = o.job_id
        WHERE t.inputs ? 'files'""").fetchall()
    for r in rows:
        v.checked += 1
        if not (r["upload"] == "done" and r["status"] == "succeeded"
                and (r["attempt_id"] == r["won"] or r["resumed_from"])
                and f"/{r['producer']}/{r['attempt_id']}/" in r["url"]):
            v.violations.append({"step": str(r["taker"]), "file": r["url"],
                                 "producer_status": r["status"]})
    return v


def check_overlaps(conn: Connection, overlaps: Path) -> Verdict:
    """No command ran beside another on its resource while the older one's attempt was
    stopping (invariant 12). Each line of ``overlaps`` is a command that found its
    resource's lock held: `<its attempt> <the holder's attempt>`. The holder's attempt must
    have left `running` because its lease ran out (a worker frozen past its lease cannot
    stop its command: the lease is the bound) — never by a cancel or a timeout, which keep
    the resource until the command is confirmed gone."""
    v = Verdict("no command ran beside a cancelled or timed-out one on its resource "
                "(invariant 12)")
    for line in overlaps.read_text().splitlines():
        newcomer, _, holder = line.partition(" ")
        v.checked += 1
        row = conn.execute("""
            SELECT e.reason FROM job_events e
            WHERE e.attempt_id = %s::uuid AND e.from_status = 'running'
            ORDER BY e.event_id LIMIT 1""", (holder.strip() or None,)).fetchone()
        why = str(row["reason"]) if row and row["reason"] else ""
        if not why.startswith(("lease expired", "worker pod")):
            v.violations.append({"newcomer": newcomer, "holder": holder, "holder_ended": why})
    return v


# -- evidence kept outside the database: what each worker was acknowledged --------------------


def acked_events(logs: list[Path], killed: set[Path]) -> list[dict[str, Any]]:
    """Every JSON line of these worker logs (``JOBFENCE_LOG_FORMAT=json``, info level: its
    acknowledged claims ``job_claimed``, terminal writes ``job_succeeded``, and unknown
    outcomes with how they were resolved), each marked ``killed`` when its worker was
    SIGKILLed (what it left unknown ended with it: the lease and the sweeper decide), and
    ``route`` when its file is named ``acks-worker-N-ROUTE-...``."""
    events = []
    for path in logs:
        parts = path.name.split("-")
        route = parts[3] if len(parts) > 4 and parts[0] == "acks" else "direct"
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    events.append({**event, "killed": path in killed, "route": route})
    return events


def _of(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == name]


def key(e: dict[str, Any]) -> tuple[Any, Any]:
    """The attempt an event is about."""
    return e.get("job_id"), e.get("attempt_id")


def check_acks(conn: Connection, events: list[dict[str, Any]]) -> list[Verdict]:
    """What the workers were acknowledged, against what the database kept: every acked
    claim in the audit trail, every acked terminal write the job's last one, no job acked
    finished by two attempts, every unknown outcome (of a terminal write, of a claim)
    resolved — by a worker still alive to resolve it."""
    rows = {str(r["job_id"]): r for r in conn.execute(
        "SELECT job_id, status, attempt_id FROM jobs").fetchall()}
    audited = {(str(r["job_id"]), str(r["attempt_id"])) for r in conn.execute(
        "SELECT job_id, attempt_id FROM job_events "
        "WHERE to_status = 'running' AND attempt_id IS NOT NULL").fetchall()}
    claims = {(e["job_id"], e["attempt_id"]) for e in _of(events, "job_claimed")}
    finished: dict[str, set[str]] = {}
    for e in _of(events, "job_succeeded"):
        finished.setdefault(e["job_id"], set()).add(e["attempt_id"])
    unknown = {key(e) for e in _of(events, "outcome_unknown") if not e["killed"]}
    settled = {key(e) for e in events if e.get("event") in ("outcome_resolved", "outcome_left")}
    unresolved = {key(e) for e in _of(events, "outcome_unresolved")} | (unknown - settled)
    lost = {e.get("claim_id") for e in _of(events, "claim_outcome_unknown") if not e["killed"]}
    found = {e.get("claim_id") for e in events if e.get("event") in (
        "claim_outcome_resolved", "claim_outcome_left")}
    return [
        Verdict("acked claim missing from the audit trail", sorted(claims - audited)[:20],
                len(claims)),
        Verdict("acked terminal write missing", [
            (job, a) for job, attempts in finished.items() for a in attempts
            if job not in rows or rows[job]["status"] != "succeeded"
            or str(rows[job]["attempt_id"]) != a][:20], len(finished)),
        Verdict("job acked finished by two attempts",
                [job for job, attempts in finished.items() if len(attempts) > 1]),
        Verdict("unknown outcome left unresolved", sorted(unresolved, key=str)[:20],
                len(unknown)),
        Verdict("claim's unknown outcome left unresolved", sorted(map(str, lost - found)),
                len(lost)),
    ]


def ack_counts(events: list[dict[str, Any]]) -> dict[str, int]:
    """How many acknowledgements the workers logged, and how many outcomes were unknown."""
    claims = {e.get("claim_id") for e in _of(events, "claim_outcome_unknown")}
    return {"acked claims": len(_of(events, "job_claimed")),
            "acked finishes": len(_of(events, "job_succeeded")),
            "unknown outcomes": len(_of(events, "outcome_unknown")),
            "resolved": len(_of(events, "outcome_resolved")),
            "claims with unknown outcome": len(claims),
            "claims resolved": len(claims & {e.get("claim_id") for e in events if e.get(
                "event") in ("claim_outcome_resolved", "claim_outcome_left")})}
