"""The node agent: a stand-in for the kubelet on this machine, and nothing more.

What it does, as a kubelet does:

* registers one Node (``jobfence-node``) and keeps it Ready; binds every pod no scheduler
  has placed to it (as the scheduler, through ``pods/binding``);
* runs each container's ``command``/``args`` as a process from the project's installed
  environment: an image named ``jobfence…`` is that environment (entrypoint ``jobfence``,
  user 10001:10001, ``/tmp`` as home and working directory, as the Dockerfile builds it);
  any other image is refused with a pod event (``Failed to pull image ...``) and the pod
  stays Pending with ``ErrImagePull``;
* gives each container the environment a kubelet gives: ``env`` (``value`` with
  ``$(VAR)``, ``valueFrom`` field, resource, Secret and ConfigMap references), ``envFrom``,
  and ``KUBERNETES_SERVICE_HOST``/``PORT``; Secrets, ConfigMaps and tokens are read with the
  node's own identity, so the Node authorizer allows only what a pod bound to it references;
* mounts the pod's volumes in the container's own mount namespace (``enter``): emptyDir
  (shared by the pod's containers), secret, configMap, downwardAPI and projected volumes —
  the ServiceAccount token a pod automounts is a TokenRequest bound to the pod, at
  ``/var/run/secrets/kubernetes.io/serviceaccount``, where the official client's in-cluster
  configuration reads it; the container also gets PID and UTS namespaces of its own (its
  own PID 1, its hostname the pod's name), the root filesystem read-only under
  ``readOnlyRootFilesystem``, ``allowPrivilegeEscalation: false`` as no_new_privs;
* starts init containers in order, native sidecars (``restartPolicy: Always``) first and
  left running, then the containers; stops the sidecars once the containers have ended;
* honours ``runAsUser``/``runAsGroup`` (container over pod), ``supplementalGroups``,
  ``fsGroup`` as a group, and refuses uid 0 under ``runAsNonRoot``;
* reports Pending, Running, then Succeeded or Failed with each container's exit code
  (128 + N for signal N) through ``pods/status``;
* on deletion sends SIGTERM (sidecars after the containers), waits the grace period (at
  least 2 s, also for a forced deletion), SIGKILLs, writes a terminal phase, and deletes
  the pod with grace 0 and a UID precondition; it never removes a finalizer (the Job
  controller's ``batch.kubernetes.io/job-tracking`` is the Job controller's to remove);
* restarted, it reports the pods bound to it that it no longer runs (their processes died
  with the previous agent) as Failed, ``ContainerStatusUnknown``, exit code 137;
* serves the containers' logs to the API server (``kubectl logs``, ``-f``, ``--tail``;
  ``logs``), with the node's serving certificate, to the API server's client certificate
  only. A container's output is also in
  ``<cluster>/agent/logs/<namespace>_<pod>_<uid>/<container>.log``.

What it does not model: images (nothing is pulled; only ``jobfence…`` maps to anything),
resource requests and limits (no cgroups; the Node's capacity is nominal), probes, restart
policies other than Never (a container is not restarted; ``OnFailure`` behaves as Never),
networking (every pod shares the host's network and 127.0.0.1; no Services, no DNS, no
NetworkPolicy), ``hostPath``, persistent and CSI volumes (refused), seccomp and capabilities
beyond dropping root, sizeLimit of emptyDirs, token rotation (a pod's token lives an hour),
node pressure and eviction, ``kubectl exec``/``attach``/``port-forward`` (the one kubelet
endpoint served is the logs').
It runs as root (namespaces, setuid) and is never shipped.
"""
