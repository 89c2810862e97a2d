"""The local cluster's own network namespace: everything of the cluster runs inside it, and
nothing of it reaches the host's network.

``ip netns add NAME`` makes it (a bind mount in ``/var/run/netns``); a process enters it
with ``setns`` (``enter``), which its children inherit — never with ``ip netns exec``, which
remounts ``/sys`` and hides the cgroup filesystem from the kubelet. Inside:

* ``lo``, up: etcd, the API server, PostgreSQL and the tests reach each other on 127.0.0.1;
* the bridge ``BRIDGE`` with ``GATEWAY`` (the node's IP): the CNI ``bridge`` plugin attaches
  each pod to it, and a pod reaches what listens on the gateway (PostgreSQL, the kubelet);
* ``SERVICE_IP`` (the ``kubernetes`` Service's ClusterIP) as a local address: a pod's
  in-cluster configuration reaches the API server there, on 443, with no kube-proxy.

The namespace has no route out, so no pod's traffic can leave it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from devtools.cluster.certs import NODE_IP, SERVICE_IP
from devtools.cluster.processes import ClusterError

NETNS_DIR = Path("/var/run/netns")
BRIDGE = "jf0"
POD_SUBNET = "10.244.0.0/24"
GATEWAY = NODE_IP
"""The bridge's address: the node's InternalIP, where pods reach PostgreSQL and the
kubelet is reached by the API server."""
API_PORT = 443
"""The API server's port inside the namespace: the ``kubernetes`` Service's port, so that a
pod's in-cluster configuration reaches it at ``SERVICE_IP`` as it is."""
CLONE_NEWNET = 0x40000000
BRIDGE_MAC = "02:6a:66:00:00:01"
"""The bridge's own, fixed address: unset, a Linux bridge takes the lowest of its ports'
addresses, so each pod that comes or goes could change the gateway's MAC under the other
pods' ARP caches, and their traffic to it would vanish until they asked again (a
connection to PostgreSQL timing out)."""


def path(name: str) -> Path:
    return NETNS_DIR / name


def exists(name: str) -> bool:
    return path(name).exists()


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ClusterError(f"`ip {' '.join(args)}` failed: {out.stderr.strip()}")


def inside(name: str) -> bool:
    """Whether this process already runs in the namespace ``name``."""
    try:
        mine, theirs = os.stat("/proc/self/ns/net"), os.stat(path(name))
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def create(name: str) -> None:
    """Make the namespace with its loopback, bridge and Service address (root only)."""
    _ip("netns", "add", name)
    try:
        for args in (("link", "set", "lo", "up"),
                     ("addr", "add", f"{SERVICE_IP}/32", "dev", "lo"),
                     ("link", "add", BRIDGE, "type", "bridge"),
                     ("link", "set", BRIDGE, "address", BRIDGE_MAC),
                     ("addr", "add", f"{GATEWAY}/{POD_SUBNET.split('/')[1]}", "dev", BRIDGE),
                     ("link", "set", BRIDGE, "up")):
            _ip("-n", name, *args)
    except BaseException:
        delete(name)
        raise


def delete(name: str) -> None:
    if exists(name):
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


def enter(name: str) -> None:
    """Move this process (its calling thread: call it before any thread starts) into the
    namespace; what it starts afterwards runs there too."""
    if inside(name):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path(name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise ClusterError(f"cannot enter network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


@contextlib.contextmanager
def returning() -> Iterator[None]:
    """Whatever namespace the block enters (a cluster's ``up``), this thread is back in the
    one it was in after it: for a process that starts a cluster, measures it and goes on
    (the benchmarks)."""
    fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield
    finally:
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                raise ClusterError("cannot return to this process's network namespace: "
                                   f"{os.strerror(ctypes.get_errno())}")
        finally:
            os.close(fd)


def nsenter(name: str) -> list[str]:
    """The argv prefix that runs a command inside the namespace (for people's shells)."""
    return ["nsenter", f"--net={path(name)}", "--"]
