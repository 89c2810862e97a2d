"""The life of one claim: the claim itself (a fresh ``attempt_id``, the fence) and every
write after it — heartbeat, action results, outputs, the terminal write, a give-back —
each predicated on the fence and a live lease, each saying whether it matched.

A terminal write settles the job's dependents in the same round trip, as a second
transaction after its Sync (``jobfence.store.dependencies`` says why).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from jobfence import db
from jobfence.limits import MAX_DETAIL_CHARS, MAX_ERROR_CHARS, storable_text
from jobfence.store.batches import ClaimRequest, TerminalWrite
from jobfence.store.dependencies import Settling
from jobfence.store.types import (
    NO_OUTCOME,
    ActionOutcome,
    Claim,
    Fence,
    RetryPolicy,
    Transition,
    transitions,
)


def _texts(**values: str | None) -> dict[str, str | None]:
    """Reasons and errors made storable (error_detail gets the longer cap)."""
    return {k: storable_text(v, MAX_DETAIL_CHARS if k == "error_detail" else MAX_ERROR_CHARS)
            for k, v in values.items()}


class Attempts(Settling):
    sql_file = "attempts.sql"

    def claim(self, *, worker_id: str, lease_seconds: float, queue: str = "default",
              limit: int = 1, claim_id: UUID | None = None) -> list[Claim]:
        """Claim up to ``limit`` ready jobs of ``queue``, each with a fresh fence; [] when
        nothing is ready, the queue is paused or at its limit, or drain mode is on.
        ``claim_id`` names the claim, so that it can be given back (``release_claim``)
        when its answer is lost."""
        return self._rows("claim", self._claim_params(
            ClaimRequest(worker_id, lease_seconds, queue, limit, claim_id)), Claim)

    @staticmethod
    def _claim_params(r: ClaimRequest) -> dict[str, Any]:
        return {"worker_id": r.worker_id, "lease_seconds": r.lease_seconds, "queue": r.queue,
                "limit": r.limit, "claim_id": r.claim_id}

    def next_due(self, queue: str) -> float | None:
        """Seconds until the next job of ``queue`` that is not ready yet becomes ready;
        None when none is scheduled (or more priorities wait than the look walks)."""
        [row] = self._all("next_due", {"queue": queue})
        seconds: float | None = row["seconds"]
        return seconds

    def release_claim(self, *, claim_id: UUID, worker_id: str,
                      reason: str) -> list[Transition]:
        """Give back the jobs of a claim whose answer was lost with its connection (it may
        have committed): pending at once, their attempts not spent. [] when it had not
        committed, or its jobs are no longer held by that claim."""
        return transitions(self._all("release_claim", {
            "claim_id": claim_id, "worker_id": worker_id, "reason": storable_text(reason)}))

    def heartbeat(self, *, job_id: UUID, attempt_id: UUID,
                  lease_seconds: float) -> datetime | None:
        """Renew the lease; the new deadline, or None when the fence is lost."""
        row = self._one("heartbeat", {"job_id": job_id, "attempt_id": attempt_id,
                                      "lease_seconds": lease_seconds})
        return row["lease_expires_at"] if row else None

    def record_action(self, *, job_id: UUID, attempt_id: UUID, outcome: ActionOutcome) -> bool:
        """Record one action's outcome under the fence; False when the fence is lost."""
        return self._one("record_action", {"job_id": job_id, "attempt_id": attempt_id,
                                           **outcome.params()}) is not None

    def finish(self, *, job_id: UUID, attempt_id: UUID, succeeded: bool,
               outcome: ActionOutcome | None = None, reason: str | None = None,
               error: str | None = None, error_detail: str | None = None) -> Transition | None:
        """Fenced terminal write, with the last action's outcome in the same statement;
        None when the fence is lost (nothing written). Its dependents are settled in the same
        round trip, after its commit."""
        status = "succeeded" if succeeded else "failed"
        with db.pipeline(self.conn) as sync:
            fin = self._execute("finish", {
                "job_id": job_id, "attempt_id": attempt_id, "status": status,
                **_texts(reason=reason or status, error=error, error_detail=error_detail),
                **(outcome.params("action_") if outcome else NO_OUTCOME)})
            sync()  # the terminal write commits here
            self.dependencies.settle_cursor([job_id])
        return self._finished(fin.fetchone())

    def finish_many(self, writes: Sequence[TerminalWrite], *,
                    claim: ClaimRequest | None = None) -> tuple[set[UUID], list[Claim]]:
        """Terminal writes of many attempts in one statement, each matched on its own fence
        (a write whose fence was lost matches nothing; the others are written), and — in
        the same transaction, so in the same round trip and commit — the claim of up to
        ``claim.limit`` ready jobs, each with a fresh fence. The jobs written, and the
        claims. Their dependents are settled in the same round trip, after the commit.

        A batch of one — every terminal write of a worker running one job at a time — goes
        as the single-row write (``finish``): the same fenced update, outcome and audit,
        without a JSON array built here and taken apart by the server."""
        with db.pipeline(self.conn) as sync:
            if len(writes) == 1:
                fin = self._execute("finish", writes[0].params())
            else:
                fin = self._execute("finish_many", {
                    "rows": json.dumps([w.row() for w in writes], default=str)})
            nxt = (db.execute(self.conn, self.sql["claim"], self._claim_params(claim),
                              row=Claim)
                   if claim is not None and claim.limit > 0 else None)
            sync()  # the terminal writes (and the claims) commit here
            self.dependencies.settle_cursor([w.job_id for w in writes])
        claims: list[Claim] = nxt.fetchall() if nxt is not None else []
        return {r["job_id"] for r in fin.fetchall()}, claims

    def heartbeat_many(self, held: Sequence[tuple[UUID, UUID]],
                       lease_seconds: float) -> dict[UUID, datetime]:
        """Renew the lease of every (job_id, attempt_id) held, in one statement, each
        matched on its own fence: the new deadline of each one renewed (a job missing has
        lost its fence)."""
        return {r["job_id"]: r["lease_expires_at"] for r in self._all("heartbeat_many", {
            "job_ids": [j for j, _ in held], "attempt_ids": [a for _, a in held],
            "lease_seconds": lease_seconds})}

    def interrupt_many(self, held: Sequence[tuple[UUID, UUID]], *, reason: str,
                       max_interruptions: int) -> list[Transition]:
        """``interrupt`` for every (job_id, attempt_id) held, in one statement, each matched
        on its own fence: the jobs given back."""
        rows = self._all("interrupt_many", {
            "job_ids": [j for j, _ in held], "attempt_ids": [a for _, a in held],
            "reason": storable_text(reason), "max_interruptions": max_interruptions})
        done = transitions(rows)
        self.dependencies.settle(done)
        return done

    @staticmethod
    def _finished(row: dict[str, Any] | None) -> Transition | None:
        """The terminal write's transition; None when the fence was lost."""
        return transitions([row])[0] if row is not None else None

    def release(self, *, job_id: UUID, attempt_id: UUID, reason: str,
                retry: RetryPolicy, outcome: ActionOutcome | None = None,
                error: str | None = None, error_detail: str | None = None) -> Transition | None:
        """Fenced give-back: pending after the retry delay, or failed when attempts are
        exhausted; the failed action's outcome in the same statement. None when the fence
        is lost."""
        row = self._one("release", {
            "job_id": job_id, "attempt_id": attempt_id, **retry.params(),
            **_texts(reason=reason, error=error, error_detail=error_detail),
            **(outcome.params("action_") if outcome else NO_OUTCOME)})
        return self._settled(row)

    def interrupt(self, *, job_id: UUID, attempt_id: UUID, reason: str,
                  max_interruptions: int) -> Transition | None:
        """Fenced give-back after SIGTERM: pending at once, the attempt not counted while
        the job has taken fewer than ``max_interruptions``; else as ``release``. None when
        the fence is lost."""
        row = self._one("interrupt", {
            "job_id": job_id, "attempt_id": attempt_id, "reason": storable_text(reason),
            "max_interruptions": max_interruptions})
        return self._settled(row)

    def snooze(self, *, job_id: UUID, attempt_id: UUID, delay_seconds: float, reason: str,
               max_snoozes: int, outcome: ActionOutcome | None = None) -> Transition | None:
        """Fenced give-back asked for by an action: pending again after ``delay_seconds``,
        the attempt not counted, the snooze counted; failed instead when the job has snoozed
        ``max_snoozes`` times already. The snoozing action's outcome (its output) is
        recorded with it, as ``snoozed``. None when the fence is lost."""
        row = self._one("snooze", {
            "job_id": job_id, "attempt_id": attempt_id, "delay_seconds": delay_seconds,
            "reason": storable_text(reason), "max_snoozes": max_snoozes,
            **(outcome.params("action_") if outcome else NO_OUTCOME)})
        return self._settled(row)

    def _settled(self, row: dict[str, Any] | None) -> Transition | None:
        if row is None:
            return None
        done = transitions([row])
        self.dependencies.settle(done)
        return done[0]

    def fence(self, job_id: UUID, attempt_id: UUID) -> Fence | None:
        """Where a job's fence stands now for this attempt (after a write whose outcome was
        lost with the connection, or to say why a heartbeat matched nothing)."""
        return self._row("fence", {"job_id": job_id, "attempt_id": attempt_id}, Fence)

    def holding(self, claims: Sequence[tuple[UUID, UUID]]) -> set[UUID]:
        """Which of these (job_id, attempt_id) still hold their job's fence with a live
        lease: the worker's cheap look for a cancel it was not told of."""
        return {r["job_id"] for r in self._all("holding", {
            "job_ids": [j for j, _ in claims], "attempt_ids": [a for _, a in claims]})}

    def stopped(self, *, job_id: UUID, attempt_id: UUID) -> bool:
        """This attempt, whose fence was rotated while its command ran, confirms that the
        command is gone: its job's resource is free and the job may run again. False when
        the attempt was not stopping (nothing to confirm)."""
        row = self._one("stopped", {"job_id": job_id, "attempt_id": attempt_id})
        return bool(row and row["confirmed"])

    def done_actions(self, job_id: UUID, attempt_id: UUID) -> set[int]:
        """Indexes of the actions earlier attempts of the job's current run finished (since
        its last operator retry), for the attempt holding the fence: a claim that resumes
        skips them."""
        return {r["action_index"] for r in self._all("done_actions", {
            "job_id": job_id, "attempt_id": attempt_id})}

    # -- outputs ---------------------------------------------------------------------------

    def register_outputs(self, *, job_id: UUID, attempt_id: UUID,
                         outputs: Sequence[tuple[str, str]]) -> bool:
        """Register (path, url) outputs as uploading, under the fence; False when lost: the
        check that this attempt still owns the job, done by the database."""
        rows = self._all("register_outputs", {
            "job_id": job_id, "attempt_id": attempt_id,
            "outputs": json.dumps([{"path": p, "url": u} for p, u in outputs])})
        return len(rows) == len(outputs)

    def register_log(self, *, job_id: UUID, attempt_id: UUID, action_index: int) -> bool:
        """Register an action's streams as going to S3, under the fence; False when lost
        (then nothing of it is written there)."""
        row = self._one("register_log", {"job_id": job_id, "attempt_id": attempt_id,
                                         "action_index": action_index})
        return row is not None and row["action_index"] is not None

    def confirm_outputs(self, *, job_id: UUID, attempt_id: UUID,
                        outputs: Sequence[dict[str, Any]]) -> bool:
        """Mark outputs done (``size_bytes``) or error (``error``), under the fence."""
        rows = self._all("confirm_outputs", {"job_id": job_id, "attempt_id": attempt_id,
                                             "outputs": json.dumps(list(outputs))})
        return len(rows) == len(outputs)
