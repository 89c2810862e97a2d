"""The local cluster's node: containerd and runc from Debian, a kubelet and kube-scheduler
built from the same pinned Kubernetes as the API server (``devtools.controlplane``).

Everything runs inside the cluster's network namespace (``devtools.cluster.network``) with
files of its own under ``<cluster>/node`` (containerd's root, the pods' logs, the CNI
configuration), the kubelet's under ``/var/lib/jobfence/<namespace>/kubelet`` and
containerd's sockets under ``/run/jobfence/<namespace>`` (short paths: a unix socket's path
has a limit). What this host asks of them, each tried here:

* containerd with cgroupfs (no systemd), ``restrict_oom_score_adj`` (no CAP_SYS_RESOURCE:
  without it every sandbox fails), AppArmor off (no securityfs), network namespaces'
  mounts under its own state directory; the pause image made locally (``devtools.image``);
* the kubelet with ``failCgroupV1: false`` (this host's cgroups are v1), a ``cgroupRoot`` of
  its own (``/jobfence-<namespace>``: its pods' cgroups, the limits they enforce), the
  bridge's address as node IP, webhook authentication and authorization (the API server's
  client certificate is bound to ``system:kubelet-api-admin``: logs, exec, port-forward),
  its serving certificate from the cluster's CA;
* the kubelet sets ``vm.overcommit_memory``, ``kernel.panic`` and ``kernel.panic_on_oops``
  at start with no opt-out: their values are saved before and restored once the node is
  Ready, and again by ``cluster-down``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from devtools.cluster import network
from devtools.cluster.processes import ClusterError, Started, start
from devtools.image import PAUSE_IMAGE

CGROUP_FS = Path("/sys/fs/cgroup")
CNI_BIN = Path("/usr/lib/cni")
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
"""What the kubelet sets at every start (``protectKernelDefaults: false``)."""
PROGRAMS = {"containerd": "containerd", "containerd-shim-runc-v2": "containerd",
            "runc": "runc", "ctr": "containerd", "nsenter": "util-linux",
            "ip": "iproute2", str(CNI_BIN / "bridge"): "containernetworking-plugins"}
"""A program the node needs, and the Debian package that has it."""


def missing_programs() -> list[str]:
    out = []
    for program, package in PROGRAMS.items():
        found = Path(program).exists() if program.startswith("/") else shutil.which(program)
        if not found:
            out.append(f"{program} (Debian package {package})")
    return out


class Node:
    """The node's files and processes for one cluster (``root``) in namespace ``netns``."""

    def __init__(self, root: Path, netns: str, name: str) -> None:
        self.root = root / "node"
        self.netns = netns
        self.name = name
        self.run_dir = Path("/run/jobfence") / netns
        self.cgroup_root = f"/jobfence-{netns}"
        self.kubelet_root = Path("/var/lib/jobfence") / netns / "kubelet"
        """The kubelet's own directory (the pods' volumes, its sockets) at a short path, as
        ``/var/lib/kubelet`` is: a unix socket's path has a limit of 107 bytes, which a
        cluster directory deep in a checkout would pass."""

    # -- files -------------------------------------------------------------------------------

    @property
    def socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    def containerd_config(self) -> Path:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        text = f"""version = 2
root = "{self.root / 'containerd' / 'root'}"
state = "{self.run_dir / 'state'}"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.socket}"
[ttrpc]
  address = ""
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{self.root / 'containerd' / 'opt'}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{shutil.which('runc') or 'runc'}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{self.root / 'cni'}"
"""
        path = self.root / "containerd.toml"
        path.write_text(text)
        return path

    def cni_config(self) -> None:
        conf = {"cniVersion": "1.0.0", "name": "jobfence", "plugins": [
            {"type": "bridge", "bridge": network.BRIDGE, "isGateway": True, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": str(self.root / "cni-ipam"),
                      "ranges": [[{"subnet": network.POD_SUBNET,
                                   "gateway": network.GATEWAY}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}}]}
        (self.root / "cni").mkdir(parents=True, exist_ok=True)
        (self.root / "cni" / "10-jobfence.conflist").write_text(json.dumps(conf, indent=2))

    def kubelet_config(self, pki: Path) -> Path:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root,
            "cgroupsPerQOS": True, "failSwapOn": False, "resolvConf": "",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": network.GATEWAY, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "podLogsDir": str(self.pod_logs),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(pki / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(pki / f"kubelet-{self.name}.crt"),
            "tlsPrivateKeyFile": str(pki / f"kubelet-{self.name}.key"),
            "rotateCertificates": False, "serverTLSBootstrap": False,
            "clusterDomain": "cluster.local",
            # A shared machine: evict only when really short (the defaults would evict at
            # 10% free disk).
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "nodeStatusReportFrequency": "10s", "syncFrequency": "10s",
            "shutdownGracePeriod": "0s", "serializeImagePulls": False,
            "protectKernelDefaults": False,
        }
        path = self.root / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    # -- preparing the host --------------------------------------------------------------------

    def cgroups(self) -> None:
        """The kubelet's ``cgroupRoot`` in every v1 hierarchy (it must exist), its cpuset
        filled from the parent's (a new cpuset cgroup starts empty)."""
        for hierarchy in _hierarchies():
            where = hierarchy / self.cgroup_root.lstrip("/")
            where.mkdir(exist_ok=True)
            if hierarchy.name.startswith("cpuset") or (hierarchy / "cpuset.cpus").exists():
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if (hierarchy / f).exists():
                        (where / f).write_text((hierarchy / f).read_text())

    def save_sysctls(self) -> None:
        values = {k: Path(f"/proc/sys/{k}").read_text().strip() for k in SYSCTLS}
        (self.root / "sysctls.json").write_text(json.dumps(values))

    def restore_sysctls(self) -> None:
        restore_sysctls(self.root)

    # -- the processes -------------------------------------------------------------------------

    def start_containerd(self, logs: Path) -> Started:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.cni_config()
        return start(["containerd", "--config", str(self.containerd_config()),
                      "--log-level", "warn"], log=logs / "containerd.log")

    def containerd_ready(self) -> bool:
        out = subprocess.run(self.ctr("version"), capture_output=True, text=True,
                             check=False, timeout=10)
        return out.returncode == 0 and "Server:" in out.stdout

    def ctr(self, *args: str) -> list[str]:
        return ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args]

    def import_image(self, archive: Path) -> None:
        """An image archive (``docker-archive`` or OCI) into containerd's ``k8s.io``
        namespace, where the kubelet finds it (nothing is pulled); unpacked now, so that a
        first pod does not wait for it."""
        out = subprocess.run(self.ctr("images", "import", str(archive)),
                             capture_output=True, text=True, check=False, timeout=600)
        if out.returncode != 0:
            raise ClusterError(f"importing {archive} into containerd failed: "
                               f"{out.stderr.strip()[-500:]}")

    def images(self) -> list[str]:
        out = subprocess.run(self.ctr("images", "list", "-q"), capture_output=True, text=True,
                             check=False, timeout=30)
        return out.stdout.split()

    def start_kubelet(self, binary: Path, kubeconfig: Path, pki: Path, logs: Path) -> Started:
        self.cgroups()
        self.save_sysctls()
        self.kubelet_root.mkdir(parents=True, exist_ok=True)
        self.pod_logs.mkdir(parents=True, exist_ok=True)
        return start([str(binary), f"--config={self.kubelet_config(pki)}",
                      f"--kubeconfig={kubeconfig}", f"--root-dir={self.kubelet_root}",
                      f"--cert-dir={self.kubelet_root / 'pki'}",
                      f"--hostname-override={self.name}", f"--node-ip={network.GATEWAY}",
                      "--v=1"], log=logs / "kubelet.log")

    def start_scheduler(self, binary: Path, kubeconfig: Path, logs: Path) -> Started:
        return start([str(binary), f"--kubeconfig={kubeconfig}",
                      f"--authentication-kubeconfig={kubeconfig}",
                      f"--authorization-kubeconfig={kubeconfig}",
                      "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
                      "--v=0"], log=logs / "kube-scheduler.log")

    # -- taking it down ----------------------------------------------------------------------

    def kill_pods(self) -> None:
        """SIGKILL every process left in the pods' cgroups, then containerd's shims of this
        node (they outlive containerd by design)."""
        for _ in range(50):
            pids = self.pod_pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for pid in self.shim_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def pod_pids(self) -> set[int]:
        pids: set[int] = set()
        where = CGROUP_FS / "pids" / self.cgroup_root.lstrip("/")
        if where.exists():
            for procs in where.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
        return pids

    def pids_of_pod(self, uid: str) -> set[int]:
        """The processes of a pod's containers (and its sandbox), from the pod's cgroup."""
        pids: set[int] = set()
        where = CGROUP_FS / "pids" / self.cgroup_root.lstrip("/")
        for pod in where.rglob(f"pod{uid}") if where.exists() else ():
            for procs in pod.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
        return pids

    def shim_pids(self) -> set[int]:
        """containerd-shim-runc-v2 processes started for this node's containerd (their
        command line names its socket)."""
        needle = f"-address\0{self.socket}\0".encode()
        out = set()
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    if needle in (proc / "cmdline").read_bytes():
                        out.add(int(proc.name))
        return out

    def clean(self) -> None:
        """After every process of the node stopped: unmount what is mounted under its
        directories, remove its cgroups, restore the sysctls."""
        unmount_under(self.root)
        unmount_under(self.run_dir)
        unmount_under(self.kubelet_root.parent)
        self.restore_sysctls()
        # and the unified (v2) hierarchy's, where runc makes one beside the v1 ones
        for hierarchy in [*_hierarchies(), CGROUP_FS / "unified"]:
            _rmdir_tree(hierarchy / self.cgroup_root.lstrip("/"))
        shutil.rmtree(self.run_dir, ignore_errors=True)
        shutil.rmtree(self.kubelet_root.parent, ignore_errors=True)
        for shared in (self.run_dir.parent, self.kubelet_root.parent.parent):
            with contextlib.suppress(OSError):
                shared.rmdir()  # /run/jobfence, /var/lib/jobfence: when no other cluster uses it


def restore_sysctls(node_root: Path) -> None:
    saved = node_root / "sysctls.json"
    with contextlib.suppress(OSError, ValueError):
        for key, value in json.loads(saved.read_text()).items():
            target = Path(f"/proc/sys/{key}")
            if target.read_text().strip() != value:
                target.write_text(value)


def _hierarchies() -> list[Path]:
    """The v1 hierarchies (the named ``systemd`` one too: the kubelet checks it; not v2)."""
    out = []
    for entry in sorted(CGROUP_FS.iterdir()) if CGROUP_FS.exists() else []:
        if entry.is_symlink() or not entry.is_dir() or entry.name == "unified":
            continue
        if (entry / "cgroup.procs").exists():
            out.append(entry)
    return out


def _rmdir_tree(top: Path) -> None:
    if not top.exists():
        return
    for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


MNT_DETACH = 2


def unmount_under(top: Path) -> None:
    """Lazily unmount every mount point under ``top``, deepest first (overlay root
    filesystems, the pods' tmpfs volumes, network namespaces' bind mounts)."""
    top_s = str(top.resolve()) if top.exists() else str(top)
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(3):
        points = []
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/mountinfo").read_text().splitlines():
                point = line.split()[4].replace("\\040", " ")
                if point == top_s or point.startswith(top_s + "/"):
                    points.append(point)
        if not points:
            return
        for point in sorted(points, key=len, reverse=True):
            libc.umount2(point.encode(), MNT_DETACH)


def kubelet_rbac() -> list[dict[str, Any]]:
    """The API server's client identity may use the kubelet's API (logs, exec,
    port-forward): what kubeadm binds."""
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "jobfence-apiserver-kubelet-client"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": "system:kubelet-api-admin"},
             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                           "name": "kube-apiserver-kubelet-client"}]}]
