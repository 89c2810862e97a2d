"""The periodic wing: the passes the CronJobs run, each a module with
``run_once(settings, deps) -> Report`` whose docstring says what it does, its options and
the counts it reports — ``sweeper``, ``reconciliation``, ``lifecycle`` (with its
``retention`` step), ``export_finalize``, ``orphan_cleanup``, ``schedules`` — and the one
harness they share (``harness``: the lease, the run record, the budget of batches
(``budget``), the report and the metrics push). The entrypoints in ``jobfence.functions``
are each one line: the harness running the pass.
"""
