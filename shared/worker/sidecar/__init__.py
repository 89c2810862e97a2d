"""The command sidecar: its protocol, the worker's side (``link``) and the sidecar's own
(``serve``, run as ``jobfence command-runner``)."""
