"""The worker wing: everything a worker process is, composed.

==============  ===========================================================================
module          what it is
==============  ===========================================================================
loop            the loop: claims for free slots, runs each claimed job in a slot, counts
                what each returns, stops (nothing ready, max jobs or seconds, SIGTERM)
execution       the execution of one claimed attempt: its actions, its fenced writes, its
                terminal write; returns its ``Result``
store_link      the worker's connection: claims, fenced writes, terminal writes in batches
                with the next claims riding on them
guard           each execution's lease, run deadline and kill switch; the worker's
                heartbeat (every lease in one statement) and watchdog threads
side_channel    the guards' own connection (LISTEN for stops where it can)
wakeup          told when the queue has work ready (LISTEN), so that a waiting loop looks
sandbox         what a job's child gets: its environment; where its spaces come from
jobspace        a job's space made by the worker itself (``LocalSpaces``)
sidecar         the command sidecar: its protocol, the worker's link, the sidecar's side
proctree        a job's process tree: subreaper, per-job kill, reaping
==============  ===========================================================================

``jobfence.functions.worker`` holds only ``main()``; the command sidecar's entry point
(``jobfence.functions.command_runner``) uses ``sidecar``, ``proctree`` and ``sandbox``.
Nothing here imports the console or the periodic functions (an import-linter contract).
"""
