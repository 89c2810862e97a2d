"""The node agent as a process: ``python -m devtools.cluster.agent --dir CLUSTER --node N
--api-port P`` (``cluster-up`` starts it). SIGTERM stops it, and its pods' processes."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from devtools.cluster import certs
from devtools.cluster.agent.agent import Agent
from devtools.cluster.agent.logs import LogServer
from devtools.cluster.rest import Credentials, Rest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.cluster.agent")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--api-port", type=int, required=True)
    parser.add_argument("--root", type=Path, default=None,
                        help="where its pods' files go (default: DIR/agent)")
    parser.add_argument("--no-bind", action="store_true",
                        help="run only the pods bound to this node; bind none (a second node)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    pki = args.dir / "pki"

    def rest(who: certs.Identity) -> Rest:
        return Rest(Credentials.from_kubeconfig(pki / f"{who.file}.kubeconfig"))

    agent = Agent(root=args.root or args.dir / "agent", node=args.node,
                  node_api=rest(certs.node(args.node)), scheduler_api=rest(certs.SCHEDULER),
                  admin_api=rest(certs.ADMIN), api_port=args.api_port, binds=not args.no_bind)
    serving = pki / f"kubelet-{args.node}"
    if serving.with_suffix(".crt").exists():
        agent.logs = LogServer(cert=serving.with_suffix(".crt"), key=serving.with_suffix(".key"),
                               ca=pki / "ca.crt", locate=agent.locate)

    def stop(_signum: int, _frame: Any) -> None:
        agent.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.run()
    return 0


sys.exit(main(sys.argv[1:]))
