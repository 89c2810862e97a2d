-- 0030: a job a schedule enqueues carries the trace context of the pass that enqueued it,
-- as every other enqueue's job does (0026): the schedules pass, where it traces, opens a
-- producer span for each batch of ticks and hands its traceparent with each tick.
-- scheduler_fire takes it (NULL: the pass does not trace) and is otherwise unchanged.
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

DROP FUNCTION IF EXISTS {schema}.scheduler_fire(uuid[], timestamptz[], timestamptz[], timestamptz[],
                                      uuid[]);
