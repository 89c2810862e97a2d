"""``make render`` and ``make deploy``: the kustomize base under a generated overlay
(``build/deploy``), checked against the cluster before anything is applied, applied
server-side, and the migration Job waited for.

    python -m devtools.deploy overlay --namespace NS --image IMAGE [--installation I]
                                      [--component alerts ...] [--runbook-url URL]
    python -m devtools.deploy apply --kubectl PATH [--timeout 600]

``apply`` renders the overlay and refuses (exit 2, one line per problem, nothing applied)
when the namespace is missing, when a kind needs a CRD the cluster does not have (KEDA's,
prometheus-operator's: prerequisites), or when a Secret the rendered objects read — a
container's ``secretKeyRef``/``secretRef``, a Secret volume, a TriggerAuthentication's
``secretTargetRef`` — or its key is missing. Then it deletes the previous migration Job (a
Job's pod template cannot change in place), applies every object with server-side apply,
and waits for the new migration Job to complete (exit 1 when it fails).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from devtools import REPO

OVERLAY = REPO / "build" / "deploy"
MANIFESTS = REPO / "manifests"
COMPONENTS = ("alerts", "console", "console/proxy", "metrics-exporter", "grafana-dashboards")
FIELD_MANAGER = "jobfence-deploy"
MIGRATE_JOB = "jobfence-migrate"

Obj = dict[str, Any]


class DeployError(Exception):
    """Bad input or a missing prerequisite: exit 2, nothing applied."""


# -- the overlay -----------------------------------------------------------------------------


def image_entry(image: str) -> Obj:
    """kustomize's ``images:`` entry that turns ``jobfence`` into ``image``."""
    if "@" in image:
        name, digest = image.split("@", 1)
        return {"name": "jobfence", "newName": name, "digest": digest}
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = image.rsplit(":", 1)
        return {"name": "jobfence", "newName": name, "newTag": tag}
    return {"name": "jobfence", "newName": image}


def overlay(*, namespace: str, image: str, installation: str = "",
            components: Sequence[str] = (), runbook_url: str = "",
            where: Path = OVERLAY, config: dict[str, str] | None = None,
            name_suffix: str = "", secrets: dict[str, dict[str, str]] | None = None,
            extra_patches: Sequence[Obj] = ()) -> Path:
    """Write ``where/kustomization.yaml``: the base in ``namespace`` with ``image``, the
    installation's identity (its ConfigMap value and, again, the worker pods' label), the
    optional components, and the alerts' runbook links under ``runbook_url``. ``config``
    overrides settings of the ConfigMap; ``name_suffix`` and ``secrets`` (generated with
    the objects, so that their names take the suffix too) let a second installation share
    a namespace; ``extra_patches`` are added as they are."""
    unknown = [c for c in components if c not in COMPONENTS]
    if unknown:
        raise DeployError(f"unknown component {unknown[0]!r}: one of {', '.join(COMPONENTS)}")
    if "alerts" in components and not runbook_url.startswith(("https://", "http://")):
        raise DeployError("the alerts link their runbook entries: set RUNBOOK_URL to the "
                          "absolute URL where docs/RUNBOOK.md is published "
                          "(https://.../RUNBOOK.md)")
    if "#" in runbook_url:
        raise DeployError("RUNBOOK_URL is the page itself; each alert adds its own #anchor")
    where.mkdir(parents=True, exist_ok=True)
    rel = Path(os.path.relpath(MANIFESTS, where.resolve()))
    doc: Obj = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "resources": [str(rel)], "namespace": namespace,
                "images": [image_entry(image)]}
    if name_suffix:
        doc["nameSuffix"] = name_suffix
    if components:
        doc["components"] = [str(rel / "components" / c) for c in components]
    if secrets:
        doc["secretGenerator"] = [
            {"name": name, "literals": [f"{k}={v}" for k, v in data.items()],
             "options": {"disableNameSuffixHash": True}} for name, data in secrets.items()]
    patches: list[Obj] = list(extra_patches)
    replacements: list[Obj] = []
    settings = dict(config or {})
    if installation:
        settings["JOBFENCE_INSTALLATION"] = installation
    if settings:
        patches.append({"target": {"kind": "ConfigMap", "name": "jobfence-config"},
                        "patch": json.dumps([{"op": "add", "path": f"/data/{k}", "value": v}
                                             for k, v in settings.items()])})
    if installation:
        (where / "installation-label.yaml").write_text(
            (MANIFESTS / "installation-label.yaml").read_text())
        replacements.append({"path": "installation-label.yaml"})
    if "alerts" in components:
        patches.append({"target": {"kind": "PrometheusRule", "name": "jobfence"},
                        "patch": json.dumps([{"op": "replace",
                                              "path": "/metadata/annotations/"
                                                      "jobfence.io~1runbook",
                                              "value": runbook_url}])})
        (where / "runbook-links.yaml").write_text(
            (MANIFESTS / "components" / "alerts" / "runbook-links.yaml").read_text())
        replacements.append({"path": "runbook-links.yaml"})
    if patches:
        doc["patches"] = patches
    if replacements:
        doc["replacements"] = replacements
    header = (f"# Written by make: manifests/ in namespace {namespace} with image {image}"
              + (f", installation {installation}" if installation else "")
              + (f", components {', '.join(components)}" if components else "") + ".\n")
    (where / "kustomization.yaml").write_text(header + yaml.safe_dump(doc, sort_keys=False))
    return where


# -- talking to the cluster ------------------------------------------------------------------


class Kubectl:
    def __init__(self, binary: str, kubeconfig: str | None = None) -> None:
        self.binary = binary
        self.flags = ["--kubeconfig", kubeconfig] if kubeconfig else []

    def run(self, *args: str, input: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        flags = [] if args[:1] == ("kustomize",) else self.flags
        out = subprocess.run([self.binary, *flags, *args], input=input, capture_output=True,
                             text=True, check=False)
        if check and out.returncode != 0:
            lines = out.stderr.strip().splitlines()
            more = f" (and {len(lines) - 8} lines more)" if len(lines) > 8 else ""
            raise RuntimeError(f"kubectl {' '.join(args[:3])} failed: "
                               + "\n".join(lines[:8]) + more)
        return out

    def get(self, *args: str) -> Obj | None:
        out = self.run("get", *args, "-o", "json", check=False)
        if out.returncode != 0:
            if "NotFound" in out.stderr or "not found" in out.stderr:
                return None
            raise DeployError(f"kubectl get {' '.join(args)}: "
                              f"{out.stderr.strip().splitlines()[-1:] or ['failed']}")
        data: Obj = json.loads(out.stdout)
        return data


def rendered(kubectl: Kubectl, where: Path = OVERLAY) -> list[Obj]:
    out = kubectl.run("kustomize", str(where), check=False)
    if out.returncode != 0:
        raise DeployError(f"kustomize {where}: {out.stderr.strip()}")
    text = out.stdout
    return [d for d in yaml.safe_load_all(text) if d]


def pod_templates(obj: Obj) -> Iterator[Obj]:
    kind, spec = obj["kind"], obj.get("spec") or {}
    if kind in ("Job", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"):
        yield spec["template"]
    elif kind == "CronJob":
        yield spec["jobTemplate"]["spec"]["template"]
    elif kind == "ScaledJob":
        yield spec["jobTargetRef"]["template"]


def secrets_read(objects: Sequence[Obj]) -> dict[tuple[str, str | None], list[str]]:
    """(Secret, key or None for the whole Secret) → the objects that read it."""
    out: dict[tuple[str, str | None], list[str]] = {}

    def note(name: str, key: str | None, who: str, optional: bool = False) -> None:
        if not optional:
            out.setdefault((name, key), []).append(who)

    for obj in objects:
        who = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in ("TriggerAuthentication", "ClusterTriggerAuthentication"):
            for ref in (obj.get("spec") or {}).get("secretTargetRef") or []:
                note(ref["name"], ref.get("key"), who)
        for template in pod_templates(obj):
            spec = template.get("spec") or {}
            for c in [*(spec.get("initContainers") or []), *spec.get("containers", [])]:
                for e in c.get("env") or []:
                    ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                    if ref:
                        note(ref["name"], ref["key"], who, ref.get("optional", False))
                for e in c.get("envFrom") or []:
                    if "secretRef" in e:
                        note(e["secretRef"]["name"], None, who,
                             e["secretRef"].get("optional", False))
            for v in spec.get("volumes") or []:
                if "secret" in v:
                    note(v["secret"]["secretName"], None, who, v["secret"].get("optional", False))
                for source in (v.get("projected") or {}).get("sources") or []:
                    if "secret" in source:
                        note(source["secret"]["name"], None, who,
                             source["secret"].get("optional", False))
    return out


CRD_OF = {("keda.sh", "ScaledJob"): ("scaledjobs.keda.sh", "KEDA 2.x"),
          ("keda.sh", "TriggerAuthentication"): ("triggerauthentications.keda.sh", "KEDA 2.x"),
          ("monitoring.coreos.com", "PrometheusRule"):
              ("prometheusrules.monitoring.coreos.com", "prometheus-operator")}


def problems(kubectl: Kubectl, objects: Sequence[Obj]) -> list[str]:
    """Everything that would make the apply fail or the pods never start, one line each."""
    namespaces = {o["metadata"].get("namespace") for o in objects} - {None}
    found: list[str] = []
    for ns in sorted(namespaces):
        if kubectl.get("namespace", ns) is None:
            found.append(f"namespace {ns} does not exist: kubectl create namespace {ns} "
                         "(and label it for the restricted Pod Security level; "
                         "manifests/README.md, Prerequisites)")
    if found:
        return found
    for group, kind in sorted({(o["apiVersion"].split("/")[0], o["kind"]) for o in objects
                               if "/" in o["apiVersion"]}):
        if (group, kind) in CRD_OF:
            crd, who = CRD_OF[group, kind]
            if kubectl.get("crd", crd) is None:
                found.append(f"{kind} needs the CRD {crd}, which this cluster does not have: "
                             f"install {who} first (manifests/README.md, Prerequisites)")
    [namespace] = sorted(namespaces) or ["default"]
    secrets: dict[str, Obj | None] = {o["metadata"]["name"]: o for o in objects
                                      if o["kind"] == "Secret"}
    for (name, key), readers in sorted(secrets_read(objects).items(),
                                       key=lambda kv: (kv[0][0], kv[0][1] or "")):
        if name not in secrets:
            secrets[name] = kubectl.get("secret", name, "-n", namespace)
        secret = secrets[name]
        what = ", ".join(sorted(set(readers))[:3]) + (" ..." if len(set(readers)) > 3 else "")
        if secret is None:
            found.append(f"Secret {name}{f' (key {key})' if key else ''} is missing in "
                         f"namespace {namespace}: {what} read it (manifests/README.md, "
                         "Prerequisites)")
        elif key and key not in (secret.get("data") or {}):
            found.append(f"Secret {name} in namespace {namespace} has no key {key}: "
                         f"{what} read it")
    return found


def wait_for_job(kubectl: Kubectl, namespace: str, name: str, timeout: float) -> None:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        job = kubectl.get("job", name, "-n", namespace)
        conditions = {c["type"]: c for c in ((job or {}).get("status") or {}).get(
            "conditions") or [] if c.get("status") == "True"}
        if "Complete" in conditions:
            print(f"deploy: {name} complete in {time.monotonic() - began:.0f} s", flush=True)
            return
        if "Failed" in conditions:
            raise RuntimeError(f"the migration Job {name} failed "
                               f"({conditions['Failed'].get('reason')}): kubectl -n "
                               f"{namespace} describe job {name}, and its pods' logs")
        time.sleep(1)
    raise RuntimeError(f"the migration Job {name} did not complete within {timeout:.0f} s")


def apply(kubectl: Kubectl, *, timeout: float, where: Path = OVERLAY
          ) -> subprocess.CompletedProcess[str]:
    """Check, apply, wait; what the server-side apply said (its warnings on stderr)."""
    objects = rendered(kubectl, where)
    found = problems(kubectl, objects)
    if found:
        raise DeployError("\n".join(found))
    [namespace] = sorted({o["metadata"]["namespace"] for o in objects
                          if o["metadata"].get("namespace")})
    migrate = [o["metadata"]["name"] for o in objects if o["kind"] == "Job"
               and o["metadata"]["name"].startswith(MIGRATE_JOB)]
    for name in migrate:
        kubectl.run("-n", namespace, "delete", "job", name, "--ignore-not-found",
                    "--wait=true")
    # The deploy owns every field it applies: one changed by hand (kubectl edit, another
    # apply) is set back rather than reported as a conflict.
    out = kubectl.run("apply", "--server-side", f"--field-manager={FIELD_MANAGER}",
                      "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(objects))
    print(out.stdout, end="", flush=True)
    if out.stderr.strip():
        print(out.stderr, end="", file=sys.stderr, flush=True)
    for name in migrate:
        wait_for_job(kubectl, namespace, name, timeout)
    return out


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.deploy")
    sub = parser.add_subparsers(dest="command", required=True)
    o = sub.add_parser("overlay")
    o.add_argument("--namespace", required=True)
    o.add_argument("--image", required=True)
    o.add_argument("--installation", default="")
    o.add_argument("--component", action="append", default=[])
    o.add_argument("--runbook-url", default="")
    o.add_argument("--dir", type=Path, default=OVERLAY)
    a = sub.add_parser("apply")
    a.add_argument("--kubectl", required=True)
    a.add_argument("--timeout", type=float, default=600)
    a.add_argument("--dir", type=Path, default=OVERLAY)
    args = parser.parse_args(argv)
    try:
        if args.command == "overlay":
            components = [c for arg in args.component for c in arg.split() if c]
            overlay(namespace=args.namespace, image=args.image, installation=args.installation,
                    components=components, runbook_url=args.runbook_url, where=args.dir)
        else:
            apply(Kubectl(args.kubectl), timeout=args.timeout, where=args.dir)
    except DeployError as exc:
        for line in str(exc).splitlines():
            print(f"deploy: {line}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"deploy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
