"""``make cluster-up`` / ``make cluster-down`` (and the tests' watchdog).

    python -m devtools.cluster up [--dir build/cluster] [--api-port 16443] ...
    python -m devtools.cluster down [--dir build/cluster]
    python -m devtools.cluster status [--dir build/cluster]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from devtools.cluster import network
from devtools.cluster.plane import COMPONENTS, DEFAULT_ROOT, NETNS, Plane, Ports
from devtools.cluster.processes import ClusterError


def _port(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "down", "status", "watch"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, default=DEFAULT_ROOT)
        if name == "up":
            defaults = Ports()
            p.add_argument("--api-port", type=int,
                           default=_port("CLUSTER_API_PORT", defaults.api))
            p.add_argument("--etcd-port", type=int,
                           default=_port("CLUSTER_ETCD_PORT", defaults.etcd))
            p.add_argument("--etcd-peer-port", type=int,
                           default=_port("CLUSTER_ETCD_PEER_PORT", defaults.etcd_peer))
            p.add_argument("--pg-port", type=int,
                           default=_port("CLUSTER_PG_PORT", defaults.postgres))
            p.add_argument("--netns", default=os.environ.get("CLUSTER_NETNS") or NETNS,
                           help="the network namespace the cluster makes and runs in")
            p.add_argument("--image-archive", type=Path, action="append", default=[],
                           help="an image archive to import into the node's containerd")
        if name == "watch":
            p.add_argument("--owner", type=int, required=True)
    args = parser.parse_args(argv)
    root = args.dir.resolve()
    try:
        if args.command == "up":
            Plane(root, Ports(api=args.api_port, etcd=args.etcd_port,
                              etcd_peer=args.etcd_peer_port, postgres=args.pg_port),
                  COMPONENTS,
                  netns=args.netns,
                  images=tuple(a.resolve() for a in args.image_archive)).up()
        elif args.command == "down":
            if not Plane(root).down():
                print(f"cluster: nothing to take down in {root}")
        elif args.command == "status":
            plane = Plane(root)
            state = plane.state()
            if state is None:
                print(f"cluster: not up ({root})")
                return 1
            plane = Plane(root, Ports(**state["ports"]), tuple(state["components"]),
                          netns=state.get("netns") or NETNS)
            if state.get("netns") and network.exists(state["netns"]):
                network.enter(state["netns"])
            up = plane.healthy()
            print(f"cluster: {'up' if up else 'partly up (make cluster-down, then up)'} "
                  f"({root})")
            return 0 if up else 1
        else:  # watch: take the cluster down when its owner (a test session) is gone
            while _alive(args.owner) and (root / "state.json").exists():
                time.sleep(1)
            Plane(root, quiet=True).down(quiet=True)
    except ClusterError as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 2
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


sys.exit(main(sys.argv[1:]))
