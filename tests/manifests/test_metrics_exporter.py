"""The optional metrics exporter (manifests/components/metrics-exporter): rendered into an
overlay beside the base, valid against the Kubernetes schemas, as restricted as every other
pod, reading as the reader role, probed without touching the database."""

from __future__ import annotations

import os
from pathlib import Path

import kubernetes_validate
import pytest

from jobfence.functions.cli import COMMANDS
from tests.support.manifests import KUBERNETES_VERSION, MANIFESTS, Obj, render


@pytest.fixture(scope="module")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    root = tmp_path_factory.mktemp("overlay")
    rel = Path(os.path.relpath(MANIFESTS, root))
    (root / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"namespace: jobfence\nresources:\n  - {rel}\n"
        f"components:\n  - {rel / 'components' / 'metrics-exporter'}\n"
        "images:\n  - name: jobfence\n    newTag: test\n")
    return render(root)


def exporter(objects: list[Obj], kind: str) -> Obj:
    [obj] = [o for o in objects if o["kind"] == kind
             and o["metadata"]["name"] == "jobfence-metrics"]
    return obj


def test_the_exporter_renders_valid_beside_the_base(overlay: list[Obj]) -> None:
    deployment, service = exporter(overlay, "Deployment"), exporter(overlay, "Service")
    for obj in (deployment, service):
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        assert obj["metadata"]["namespace"] == "jobfence"
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"][
        "labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    [port] = service["spec"]["ports"]
    [container] = pod["spec"]["containers"]
    assert port["targetPort"] == container["ports"][0]["name"] == "metrics"
    assert container["image"] == "jobfence:test"


def test_the_exporter_reads_as_the_reader_and_is_as_restricted_as_any_pod(
        overlay: list[Obj]) -> None:
    spec = exporter(overlay, "Deployment")["spec"]["template"]["spec"]
    [c] = spec["containers"]
    assert c["args"][0] in COMMANDS and c["args"][:2] == ["metrics", "--serve"]
    [dsn] = [e for e in c["env"] if e["name"] == "JOBFENCE_DATABASE_URL"]
    assert dsn["valueFrom"]["secretKeyRef"] == {"name": "jobfence-database-reader",
                                                "key": "url"}
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    # Probes never read the database: a database that is down restarts nothing.
    for probe in ("readinessProbe", "livenessProbe"):
        assert set(c[probe]) - {"periodSeconds", "failureThreshold"} == {"tcpSocket"}


def test_with_the_exporter_the_functions_stop_pushing_what_it_serves(
        overlay: list[Obj]) -> None:
    [config] = [o for o in overlay if o["kind"] == "ConfigMap"
                and o["metadata"]["name"] == "jobfence-config"]
    assert config["data"]["JOBFENCE_PUSH_QUEUE_METRICS"] == "false"
