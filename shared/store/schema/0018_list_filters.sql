-- 0018: the filters of `list`, the API and the console read an index, however many
-- finished jobs the table holds.
--
-- A page is newest first (ORDER BY job_id DESC). Over the primary key alone, a filter on a
-- resource, a queue or a label that few jobs match read the whole table to fill a page:
-- at a million jobs 0.15 s (and over a second with ids out of time order), every two
-- seconds while the console refreshes it. Each index below yields one filter's matches
-- newest first (or, for labels, few enough to sort).
--
-- Cost on enqueue, measured on 100k inserts: a few microseconds a job. A job without a
-- resource never enters jobs_resource_page, nor one without labels jobs_labels (the page
-- statement repeats that predicate so the planner may use it; the column's statistics still
-- send a common label newest first over the primary key).
--
-- Built in the migration's transaction: at a million jobs, writes to jobs wait a few
-- seconds while it runs.
CREATE INDEX jobs_resource_page ON jobs (resource, job_id) WHERE resource IS NOT NULL;
CREATE INDEX jobs_queue_page ON jobs (queue, job_id);
CREATE INDEX jobs_labels ON jobs USING gin (labels jsonb_path_ops) WHERE labels <> '{}'::jsonb;
