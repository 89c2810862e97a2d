-- The life of one claim: the claim itself and every write fenced by its attempt_id.
-- Named statements, run by the method of the same name in store/attempts.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.
--
-- Each statement calls one of the worker's functions (attempts.functions.sql): they check
-- the fence inside the database, and they are all the worker's role may run.

-- next_due --
-- Seconds until the next job of a queue not ready yet becomes ready; NULL when none is
-- scheduled.
SELECT {schema}.worker_next_due(%(queue)s::text) AS seconds;

-- claim --
-- Claim up to %(limit)s ready jobs of a queue in one statement: fresh fence, lease,
-- attempt_count + 1 (SKIP LOCKED; nothing while draining or the queue is paused; a
-- queue's limit on running jobs — an attempt still stopping counts as running — is held
-- by a transaction lock taken inside). %(claim_id)s names the claim, for release_claim.
SELECT * FROM {schema}.worker_claim(%(queue)s::text, %(worker_id)s::text,
                                    %(lease_seconds)s::float8, %(limit)s::integer,
                                    %(claim_id)s::uuid);

-- release_claim --
-- A claim whose answer was lost with its connection: the jobs it took, pending again at
-- once, their attempts not spent; none when it had not committed.
SELECT * FROM {schema}.worker_release_claim(%(claim_id)s::uuid, %(worker_id)s::text,
                                            %(reason)s::text);

-- heartbeat --
-- Renew the lease of a live attempt. NULL back: the fence is lost (cancelled, reclaimed,
-- timed out, or the lease already ran out).
SELECT {schema}.worker_heartbeat(%(job_id)s::uuid, %(attempt_id)s::uuid,
                                 %(lease_seconds)s::float8) AS lease_expires_at;

-- record_action --
-- Record one action's result under the fence (idempotent: a write retried after a dropped
-- connection is harmless).
SELECT * FROM {schema}.worker_record_action(%(job_id)s::uuid, %(attempt_id)s::uuid,
    %(action_index)s::integer, %(name)s::text, %(status)s::text, %(started_at)s::timestamptz,
    %(result)s::jsonb, %(error)s::text, %(error_detail)s::text) AS action_index;

-- finish --
-- Terminal write by the holder of the fence (succeeded or failed), and the last action's
-- outcome when one is given: recorded only if the fenced write matched.
SELECT * FROM {schema}.worker_finish(%(job_id)s::uuid, %(attempt_id)s::uuid,
    %(status)s::text, %(reason)s::text, %(error)s::text, %(error_detail)s::text,
    %(action_index)s::integer, %(action_name)s::text, %(action_status)s::text,
    %(action_started_at)s::timestamptz, %(action_result)s::jsonb, %(action_error)s::text,
    %(action_error_detail)s::text);

-- release --
-- The holder gives the job back — pending after a delay while attempts remain, else
-- failed — with the failed action's outcome when given.
SELECT * FROM {schema}.worker_release(%(job_id)s::uuid, %(attempt_id)s::uuid,
    %(base_seconds)s::float8, %(cap_seconds)s::float8, %(reason)s::text, %(error)s::text,
    %(error_detail)s::text, %(action_index)s::integer, %(action_name)s::text,
    %(action_status)s::text, %(action_started_at)s::timestamptz, %(action_result)s::jsonb,
    %(action_error)s::text, %(action_error_detail)s::text);

-- interrupt --
-- The holder gives the job back after SIGTERM: pending at once, the attempt not counted
-- (up to %(max_interruptions)s interruptions).
SELECT * FROM {schema}.worker_interrupt(%(job_id)s::uuid, %(attempt_id)s::uuid,
    %(reason)s::text, %(max_interruptions)s::integer);

-- snooze --
-- An action asked to run again later: the holder gives the job back, pending after
-- %(delay_seconds)s, the attempt not counted and the snooze counted — or failed once the
-- job has snoozed %(max_snoozes)s times; the snoozing action's outcome recorded with it.
SELECT * FROM {schema}.worker_snooze(%(job_id)s::uuid, %(attempt_id)s::uuid,
    %(delay_seconds)s::float8, %(reason)s::text, %(max_snoozes)s::integer,
    %(action_index)s::integer, %(action_name)s::text, %(action_status)s::text,
    %(action_started_at)s::timestamptz, %(action_result)s::jsonb, %(action_error)s::text,
    %(action_error_detail)s::text);

-- register_outputs --
-- Register output files before uploading them (status running), under the fence:
-- the check that this attempt still owns the job, done by the database. Idempotent.
SELECT * FROM {schema}.worker_register_outputs(%(job_id)s::uuid, %(attempt_id)s::uuid,
    %(outputs)s::jsonb) AS path;

-- register_log --
-- Register an action's output streams before their first object goes to S3, under the
-- fence (worker_register_log; idempotent). NULL back: the fence is lost.
SELECT {schema}.worker_register_log(%(job_id)s::uuid, %(attempt_id)s::uuid,
    %(action_index)s::integer) AS action_index;

-- confirm_outputs --
-- Confirm uploaded outputs (done, or error with why), under the fence.
SELECT * FROM {schema}.worker_confirm_outputs(%(job_id)s::uuid, %(attempt_id)s::uuid,
    %(outputs)s::jsonb) AS path;

-- fence --
-- Where a job's fence stands for this attempt (after a write whose outcome was lost with
-- the connection): its status, whether this attempt still holds it, and why.
SELECT * FROM {schema}.worker_fence(%(job_id)s::uuid, %(attempt_id)s::uuid);

-- done_actions --
-- Indexes of the actions earlier attempts of the job's current run finished (since its
-- last retry), for the attempt holding the fence.
SELECT * FROM {schema}.worker_done_actions(%(job_id)s::uuid, %(attempt_id)s::uuid)
    AS action_index;

-- holding --
-- Which of these attempts still hold their job's fence with a live lease: the worker's
-- cheap look, every fraction of a second, for a cancel it was not told of.
SELECT * FROM {schema}.worker_holding(%(job_ids)s::uuid[], %(attempt_ids)s::uuid[]) AS job_id;

-- stopped --
-- An attempt whose fence was rotated confirms that its command is gone: its job's
-- resource is free, and the job may be claimed again. False when it was not stopping.
SELECT {schema}.worker_stopped(%(job_id)s::uuid, %(attempt_id)s::uuid) AS confirmed;

-- heartbeat_many --
-- Renew the leases of every attempt a worker holds, each matched on its own fence; the
-- ones renewed (a job left out has lost its fence: it stops, the others run on).
SELECT * FROM {schema}.worker_heartbeat_many(%(job_ids)s::uuid[], %(attempt_ids)s::uuid[],
                                             %(lease_seconds)s::float8);

-- finish_many --
-- The terminal writes of attempts that finished, each matched on its own fence, with each
-- one's last action outcome; the jobs written (a job left out had lost its fence).
SELECT * FROM {schema}.worker_finish_many(%(rows)s::jsonb);

-- interrupt_many --
-- SIGTERM with many jobs in hand: every one given back at once, each matched on its own
-- fence (pending at once, the attempt not counted up to %(max_interruptions)s times).
SELECT * FROM {schema}.worker_interrupt_many(%(job_ids)s::uuid[], %(attempt_ids)s::uuid[],
    %(reason)s::text, %(max_interruptions)s::integer);
