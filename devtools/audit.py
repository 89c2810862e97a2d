"""Invariants read from the audit trail (``job_events``), for the tests and the chaos run:
what happened, judged from what the database recorded — never from what the workers said
about themselves."""

from __future__ import annotations

from typing import Any

from jobfence.db import Connection

# Claims of a limited queue are serialized (worker_claim, in the store's migration 0014),
# each counting the queue's running jobs with a snapshot taken after the previous claim
# committed. So, ordered by event id, the claims still open at each claim of the queue —
# itself included — are at most the queue's limit. (An end event numbered before a claim may
# have committed after it: the claim counted that job as running, so the order only ever
# overstates what the claim saw, never understates it.)
CLAIM_WINDOWS = """
WITH ev AS (
    SELECT e.job_id, e.event_id, e.to_status, e.attempt_id,
           lead(e.event_id) OVER (PARTITION BY e.job_id ORDER BY e.event_id) AS next_id
    FROM job_events e)
SELECT j.queue, j.group_key, ev.job_id, ev.event_id AS claim_id,
       coalesce(ev.next_id, 9223372036854775807) AS end_id
FROM ev JOIN jobs j ON j.job_id = ev.job_id
WHERE ev.to_status = 'running' AND ev.attempt_id IS NOT NULL AND NOT j.is_parent
"""

QUEUE_LIMIT_VIOLATIONS = f"""
WITH w AS ({CLAIM_WINDOWS})
SELECT c.queue, c.job_id, count(*) AS running, q.max_running FROM w c
JOIN queues q ON q.name = c.queue AND q.max_running IS NOT NULL
JOIN w o ON o.queue = c.queue AND o.claim_id <= c.claim_id AND o.end_id > c.claim_id
GROUP BY c.queue, c.job_id, c.claim_id, q.max_running
HAVING count(*) > q.max_running
LIMIT 5
"""

GROUP_LIMIT_VIOLATIONS = f"""
WITH w AS ({CLAIM_WINDOWS})
SELECT c.queue, c.group_key, c.job_id, count(*) AS running, q.group_limit FROM w c
JOIN queues q ON q.name = c.queue AND q.group_limit IS NOT NULL
JOIN w o ON o.queue = c.queue AND o.group_key IS NOT DISTINCT FROM c.group_key
    AND o.claim_id <= c.claim_id AND o.end_id > c.claim_id
GROUP BY c.queue, c.group_key, c.job_id, c.claim_id, q.group_limit
HAVING count(*) > q.group_limit
LIMIT 5
"""

MOST_RUNNING_IN_GROUP = f"""
WITH w AS ({CLAIM_WINDOWS})
SELECT coalesce(max(n), 0) AS most FROM (
    SELECT count(*) AS n FROM w c
    JOIN w o ON o.queue = c.queue AND o.group_key IS NOT DISTINCT FROM c.group_key
        AND o.claim_id <= c.claim_id AND o.end_id > c.claim_id
    WHERE c.queue = %s AND c.group_key IS NOT DISTINCT FROM %s GROUP BY c.claim_id) t
"""

MOST_RUNNING = f"""
WITH w AS ({CLAIM_WINDOWS})
SELECT coalesce(max(n), 0) AS most FROM (
    SELECT count(*) AS n FROM w c
    JOIN w o ON o.queue = c.queue AND o.claim_id <= c.claim_id AND o.end_id > c.claim_id
    WHERE c.queue = %s GROUP BY c.claim_id) t
"""


def queue_limit_violations(conn: Connection) -> list[dict[str, Any]]:
    """Claims that found more running jobs of their queue than its limit (a few)."""
    return [dict(r) for r in conn.execute(QUEUE_LIMIT_VIOLATIONS).fetchall()]


def group_limit_violations(conn: Connection) -> list[dict[str, Any]]:
    """Claims that found more running jobs of their group than its queue's limit on each
    group (a few); the jobs without a group are one group."""
    return [dict(r) for r in conn.execute(GROUP_LIMIT_VIOLATIONS).fetchall()]


def most_running_in_group(conn: Connection, queue: str, group: str | None) -> int:
    """The most claims of ``group`` of ``queue`` ever open at once, from the audit trail."""
    row = conn.execute(MOST_RUNNING_IN_GROUP, (queue, group)).fetchone()
    return int(row["most"]) if row else 0


def most_running(conn: Connection, queue: str) -> int:
    """The most claims of ``queue`` ever open at once, from the audit trail."""
    row = conn.execute(MOST_RUNNING, (queue,)).fetchone()
    return int(row["most"]) if row else 0
