"""Development tools for jobfence's tests, demo and benchmarks — never shipped in the wheel.

* ``embedded_pg``: a throwaway PostgreSQL cluster from the local server binaries.
* ``platform``: the local stand-in for KEDA and the CronJobs (workers and periodic
  functions as processes on this machine).
* ``controlplane``: etcd, kube-apiserver, kube-controller-manager and kubectl, built once
  from a pinned wrapper Go module and cached (``make controlplane``).
* ``gobuild``: one builder for the pinned Go tools (control plane, KEDA, the collector):
  the cache outside the work tree, its key, the links in ``build/bin``.
* ``cluster``: a local cluster — the control plane, a node (containerd and a kubelet
  running the image) in a network namespace of its own, the KEDA operator
  (``make cluster-up``/``cluster-down``; the tests' cluster).
* ``deploy``: ``make render`` and ``make deploy`` (the overlay, the checks, the apply).
* ``kube_api``: a fake Kubernetes API server the official client can talk to, for the
  transport's unit tests (faults on demand).
* ``s3``: moto's S3 server on 127.0.0.1.
* ``memory_cluster``, ``memory_objects``: in-memory fakes of the cluster and object-store
  ports, for unit tests.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""The checkout devtools runs from (devtools never leaves it): the one definition of the
repository's path for the tools, the tests, the demo and the benchmarks."""
