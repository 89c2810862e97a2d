"""What a kubelet reads out of a pod before it starts a container — the image, the user,
the environment, the volumes — for an image-less node: pure functions over the pod object
and whatever the API gave for its Secrets, ConfigMaps and tokens.

An image named ``jobfence…`` (its last path segment: ``jobfence``, ``jobfence:0.1.0``,
``registry.example/jobfence:0.1.0``) is the project's own environment: its entrypoint is
``jobfence`` from the virtualenv the agent runs from, its user 10001:10001, ``HOME`` and the
working directory ``/tmp`` — as the Dockerfile builds the image. Any other image is refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Obj = dict[str, Any]

IMAGE_USER = (10001, 10001)
"""The Dockerfile's ``USER 10001:10001``."""
IMAGE_WORKDIR = "/tmp"  # noqa: S108 (the image's WORKDIR and HOME, in the container)
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class ConfigError(Exception):
    """The container cannot be configured yet (a missing Secret, a refused setting): the
    kubelet's ``CreateContainerConfigError``; the agent tries again."""


def image_name(image: str) -> str:
    """The repository's last path segment: ``registry.example/team/etl:1.4@sha...`` → ``etl``."""
    last = image.rsplit("/", 1)[-1]
    return re.split(r"[:@]", last, maxsplit=1)[0]


def runnable(image: str) -> bool:
    return image_name(image).startswith("jobfence")


def all_containers(pod: Obj) -> list[tuple[str, Obj]]:
    """(kind, container) in start order: init containers (``sidecar`` when their
    restartPolicy is Always), then the pod's containers (``main``)."""
    spec = pod["spec"]
    out = [("sidecar" if c.get("restartPolicy") == "Always" else "init", c)
           for c in spec.get("initContainers") or []]
    return [*out, *(("main", c) for c in spec["containers"])]


# -- the user --------------------------------------------------------------------------------


@dataclass(frozen=True)
class User:
    uid: int
    gid: int
    groups: tuple[int, ...]
    no_new_privileges: bool
    read_only_root: bool


def user_of(pod: Obj, container: Obj) -> User:
    pod_sc = pod["spec"].get("securityContext") or {}
    sc = container.get("securityContext") or {}

    def pick(key: str) -> Any:
        return sc.get(key, pod_sc.get(key))

    uid = pick("runAsUser")
    gid = pick("runAsGroup")
    uid = IMAGE_USER[0] if uid is None else int(uid)
    gid = IMAGE_USER[1] if gid is None else int(gid)
    if pick("runAsNonRoot") and uid == 0:
        raise ConfigError("container's runAsUser breaks non-root policy (runAsNonRoot)")
    groups = [*(pod_sc.get("supplementalGroups") or [])]
    if pod_sc.get("fsGroup") is not None:
        groups.append(pod_sc["fsGroup"])
    return User(uid, gid, tuple(sorted({int(g) for g in groups})),
                no_new_privileges=sc.get("allowPrivilegeEscalation") is False,
                read_only_root=bool(sc.get("readOnlyRootFilesystem")))


# -- the environment -------------------------------------------------------------------------

Lookup = Callable[[str, str], Mapping[str, str] | None]
"""(kind "secret" or "configmap", name) → its data as text, or None when it does not exist."""

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` references to variables defined before; ``$$`` escapes; an
    unknown reference stays as written."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _REF.sub(sub, value)


def field_value(pod: Obj, path: str) -> str:
    meta, spec, _status = pod["metadata"], pod["spec"], pod.get("status") or {}
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": "127.0.0.1", "status.hostIPs": "127.0.0.1",
        "status.podIP": "127.0.0.1", "status.podIPs": "127.0.0.1",
    }
    if path in simple:
        return str(simple[path] or "")
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise ConfigError(f"unsupported fieldRef {path}")


_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "m": 10**-3}


def quantity(text: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?", str(text))
    if not m:
        raise ConfigError(f"unsupported quantity {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2) or ""]


def resource_value(container: Obj, ref: Obj) -> str:
    where, _, name = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    raw = (resources.get(where) or {}).get(name) or (resources.get("limits") or {}).get(name)
    if raw is None:
        raise ConfigError(f"resourceFieldRef {ref['resource']}: the node's allocatable "
                          "is not modelled; set the value on the container")
    divisor = quantity(ref.get("divisor") or "1")
    return str(math.ceil(quantity(raw) / divisor))


def environment(pod: Obj, container: Obj, lookup: Lookup,
                base: Mapping[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: the image's, then the
    kubelet's own (the API server's address), then ``envFrom`` in order, then ``env`` in
    order with ``$(VAR)`` expanded. A reference to a missing Secret, ConfigMap or key is a
    ConfigError unless it is ``optional``."""
    env = dict(base)
    for source in container.get("envFrom") or []:
        kind, ref = (("configmap", source["configMapRef"]) if "configMapRef" in source
                     else ("secret", source["secretRef"]))
        data = lookup(kind, ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise ConfigError(f'{kind} "{ref["name"]}" not found')
        prefix = source.get("prefix", "")
        env.update({prefix + k: v for k, v in data.items()})
    for var in container.get("env") or []:
        name = var["name"]
        if "value" in var:
            env[name] = expand(var["value"], env)
            continue
        source = var.get("valueFrom")
        if not source:
            env[name] = ""
            continue
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[name] = resource_value(container, source["resourceFieldRef"])
        else:
            kind, ref = (("secret", source["secretKeyRef"]) if "secretKeyRef" in source
                         else ("configmap", source["configMapKeyRef"]))
            data = lookup(kind, ref["name"])
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    continue
                what = f'{kind} "{ref["name"]}"' if data is None \
                    else f'key "{ref["key"]}" in {kind} "{ref["name"]}"'
                raise ConfigError(f"couldn't find {what}")
            env[name] = data[ref["key"]]
    return env


def argv_of(container: Obj, env: Mapping[str, str]) -> list[str]:
    """``command`` replaces the image's entrypoint (``jobfence``), ``args`` its CMD."""
    command = container.get("command") or ["jobfence"]
    args = container.get("args") if "args" in container or "command" in container \
        else ["--help"]
    return [expand(a, env) for a in [*command, *(args or [])]]


# -- volumes ---------------------------------------------------------------------------------


@dataclass
class VolumePlan:
    """A volume's files, as the kubelet would write them (path → bytes, mode), or an
    emptyDir (shared by the pod's containers, writable by anyone, as the kubelet makes it)."""

    name: str
    empty_dir: bool = False
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)


Token = Callable[[Obj], str]
"""A projected ServiceAccount token source → the token (a TokenRequest bound to the pod)."""

Binary = Callable[[str, str], Mapping[str, bytes] | None]
"""(kind, name) → data as bytes (a Secret's decoded, a ConfigMap's data and binaryData)."""


def _items(data: Mapping[str, bytes], source: Obj, kind: str, name: str,
           default_mode: int) -> dict[str, tuple[bytes, int]]:
    items = source.get("items")
    if not items:
        return {k: (v, default_mode) for k, v in data.items()}
    out = {}
    for item in items:
        if item["key"] not in data:
            if source.get("optional"):
                continue
            raise ConfigError(f'couldn\'t find key "{item["key"]}" in {kind} "{name}"')
        out[item["path"]] = (data[item["key"]], item.get("mode", default_mode))
    return out


def _projection(pod: Obj, source: Obj, lookup: Binary, token: Token,
                mode: int) -> dict[str, tuple[bytes, int]]:
    for kind, key in (("secret", "secret"), ("configmap", "configMap")):
        if key in source:
            ref = source[key]
            data = lookup(kind, ref["name"])
            if data is None:
                if ref.get("optional"):
                    return {}
                raise ConfigError(f'{kind} "{ref["name"]}" not found')
            return _items(data, ref, kind, ref["name"], ref.get("defaultMode", mode))
    if "serviceAccountToken" in source:
        ref = source["serviceAccountToken"]
        return {ref["path"]: (token(ref).encode(), mode)}
    if "downwardAPI" in source:
        return {item["path"]: (field_value(pod, item["fieldRef"]["fieldPath"]).encode(),
                               item.get("mode", mode))
                for item in source["downwardAPI"]["items"]}
    raise ConfigError(f"unsupported projected source {sorted(source)}")


def volumes(pod: Obj, lookup: Binary, token: Token) -> list[VolumePlan]:
    out = []
    for vol in pod["spec"].get("volumes") or []:
        name = vol["name"]
        if "emptyDir" in vol:
            out.append(VolumePlan(name, empty_dir=True))
        elif "projected" in vol:
            mode = vol["projected"].get("defaultMode", 0o644)
            files: dict[str, tuple[bytes, int]] = {}
            for source in vol["projected"].get("sources") or []:
                files.update(_projection(pod, source, lookup, token, mode))
            out.append(VolumePlan(name, files=files))
        elif "secret" in vol or "configMap" in vol:
            kind, ref = (("secret", vol["secret"]) if "secret" in vol
                         else ("configmap", vol["configMap"]))
            ref_name = ref.get("secretName") or ref.get("name")
            data = lookup(kind, ref_name)
            if data is None:
                if not ref.get("optional"):
                    raise ConfigError(f'{kind} "{ref_name}" not found')
                data = {}
            out.append(VolumePlan(name, files=_items(data, ref, kind, ref_name,
                                                     ref.get("defaultMode", 0o644))))
        elif "downwardAPI" in vol:
            out.append(VolumePlan(name, files=_projection(
                pod, {"downwardAPI": vol["downwardAPI"]}, lookup, token,
                vol["downwardAPI"].get("defaultMode", 0o644))))
        else:
            kinds = sorted(k for k in vol if k != "name")
            raise ConfigError(f"volume {name}: {', '.join(kinds)} volumes are not modelled by "
                              "the node agent (emptyDir, secret, configMap, projected and "
                              "downwardAPI are)")
    return out


def write_volume(plan: VolumePlan, root: Path) -> Path:
    """The volume's directory under ``root`` (made once; an emptyDir keeps its content)."""
    where = root / plan.name
    if plan.empty_dir:
        where.mkdir(parents=True, exist_ok=True)
        where.chmod(0o777)
        return where
    where.mkdir(parents=True, exist_ok=True)
    for rel, (data, mode) in plan.files.items():
        target = where / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise ConfigError(f"volume {plan.name}: path {rel!r} leaves the volume")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)
    where.chmod(0o755)
    return where


def mounts_of(container: Obj, volume_dirs: Mapping[str, Path]) -> list[Obj]:
    out = []
    for m in container.get("volumeMounts") or []:
        source = volume_dirs.get(m["name"])
        if source is None:
            raise ConfigError(f"volumeMount {m['name']}: no such volume in the pod")
        if m.get("subPath"):
            source = source / m["subPath"]
        out.append({"source": str(source), "target": m["mountPath"],
                    "readOnly": bool(m.get("readOnly"))})
    return out
