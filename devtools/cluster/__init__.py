"""A local Kubernetes control plane for the tests and for people: ``make cluster-up`` and
``make cluster-down`` (``python -m devtools.cluster up|down|status``).

* ``plane``: the components, their flags and order, their files; up, down, healthy.
* ``certs``: the CA, serving and client certificates, the ServiceAccount key (per cluster).
* ``node``: containerd and a kubelet running the image; ``network``: its namespace and bridge.
* ``crds``: the KEDA and prometheus-operator CRDs, from their pinned Go modules.
* ``database``: the cluster's own PostgreSQL (jobfence migrated, a login per role).
* ``rest``: a small JSON client of the API for the dev tools.
* ``processes``: detached processes, started and stopped by PID and start time.

The binaries come from ``devtools.controlplane`` (built from pinned sources, cached).
"""
