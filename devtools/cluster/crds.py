"""CustomResourceDefinitions of the operators jobfence's manifests use, taken from the Go
modules of those operators at pinned versions (``go mod download`` verifies them against
the checksum database, and each module's hash is pinned here too), applied server-side.
Nothing of them is committed.

* KEDA's (``config/crd``, with KEDA's own kustomize patches: without the ScaledJob patch, a
  pod template's labels and annotations are pruned);
* prometheus-operator's PrometheusRule (the optional alerts component).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from devtools import keda
from devtools.cluster.processes import ClusterError, wait_until


@dataclass(frozen=True)
class Source:
    module: str
    version: str
    sum: str
    path: str
    """A kustomization directory, or one YAML file, inside the module."""


KEDA = Source(keda.KEDA_MODULE, keda.KEDA,
              "h1:SR60v8uIcelbveS8n/1jcl8tLdBBIbHMxmdOHw8tKqA=", "config/crd")
PROMETHEUS_RULE = Source(
    "github.com/prometheus-operator/prometheus-operator", "v0.85.0",
    "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s=",
    "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml")
SOURCES = (KEDA, PROMETHEUS_RULE)


def module_dir(source: Source) -> Path:
    go = shutil.which("go")
    if go is None:
        raise ClusterError(f"{source.module}'s CRDs come from its Go module: install Go")
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOWORK": "off", "GOTOOLCHAIN": "local"}
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([go, "mod", "download", "-json",
                              f"{source.module}@{source.version}"], cwd=tmp, env=env,
                             capture_output=True, text=True, check=False)
    info = json.loads(out.stdout or "{}")
    if out.returncode != 0 or "Dir" not in info:
        raise ClusterError(f"could not download {source.module}@{source.version}: "
                           f"{info.get('Error') or out.stderr.strip()}")
    if source.sum and info.get("Sum") != source.sum:
        raise ClusterError(f"{source.module}@{source.version} has hash {info.get('Sum')}, "
                           f"not the pinned {source.sum}")
    return Path(info["Dir"])


def prefetch() -> None:
    """Download every source now: a real node's cluster runs in a network namespace with
    no route out (``devtools.cluster.network``), where nothing can be downloaded."""
    for source in SOURCES:
        module_dir(source)


def manifest(kubectl: Path, source: Source) -> str:
    where = module_dir(source) / source.path
    if where.is_dir():
        out = subprocess.run([str(kubectl), "kustomize", str(where)], capture_output=True,
                             text=True, check=False)
        if out.returncode != 0:
            raise ClusterError(f"kustomize {where}: {out.stderr.strip()}")
        return out.stdout
    return where.read_text()


def install(kubectl: Path, kubeconfig: Path) -> None:
    for source in SOURCES:
        apply = subprocess.run([str(kubectl), "--kubeconfig", str(kubeconfig), "apply",
                                "--server-side", "--field-manager=jobfence-cluster-up",
                                "-f", "-"], input=manifest(kubectl, source),
                               capture_output=True, text=True, check=False)
        if apply.returncode != 0:
            raise ClusterError(f"applying {source.module}'s CRDs: {apply.stderr.strip()}")
    names = ["scaledjobs.keda.sh", "triggerauthentications.keda.sh",
             "prometheusrules.monitoring.coreos.com"]

    def established() -> bool:
        out = subprocess.run([str(kubectl), "--kubeconfig", str(kubeconfig), "get", "crd",
                              *names, "-o", "json"], capture_output=True, text=True,
                             check=False)
        if out.returncode != 0:
            return False
        return all(any(c["type"] == "Established" and c["status"] == "True"
                       for c in (crd.get("status") or {}).get("conditions") or [])
                   for crd in json.loads(out.stdout)["items"])

    wait_until(established, what="the CRDs established", timeout=60)
