"""Job specs: what `enqueue` accepts, validated completely before anything is written.

A spec is the JSON object of docs/REFERENCE.md ("Job specs"). Validation resolves every
action by name and checks its params, parses ISO 8601 durations, and fills defaults from
settings, so the store only ever sees well-formed jobs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from uuid import UUID

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from jobfence.actions.installed import get_action
from jobfence.durations import Duration, format_duration
from jobfence.errors import InvalidSpec
from jobfence.limits import (
    MAX_DURATION,
    MAX_SPEC_BYTES,
    Unstorable,
    check_structure,
    group_key,
    queue_name,
)

MAX_SPECS_PER_CALL = 100_000

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d{1,9})?([Zz]|[+-]\d\d:\d\d)$")
"""The shape of an RFC 3339 timestamp (the values are checked by the parser after it)."""


class ActionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)
    inactivity_timeout: Duration | None = None
    """How long the action may go without output or progress (the job's own when unset)."""


class InputsSpec(BaseModel):
    """S3 inputs of a datum job: every object under ``url``; ``per_datum`` objects per
    child (in key order)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    url: str
    per_datum: int = Field(default=1, ge=1, le=10_000)

    @field_validator("url")
    @classmethod
    def _s3(cls, v: str) -> str:
        if not v.startswith("s3://") or len(v) <= len("s3://") or v[5] == "/":
            raise ValueError(f"{v!r} is not an s3://BUCKET/PREFIX url")
        return v


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    actions: list[ActionSpec] = Field(min_length=1, max_length=1000)
    resource: str | None = Field(default=None, min_length=1, max_length=500)
    max_attempts: int | None = Field(default=None, ge=1, le=1000)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    after: list[UUID] = Field(default_factory=list, max_length=1000)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=500)
    ttl: Duration | None = None
    timeout: Duration | None = None
    inactivity_timeout: Duration | None = None
    expires_in: Duration | None = None
    inputs: InputsSpec | None = None
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    queue: str = "default"
    group: str | None = None
    run_at: AwareDatetime | None = None
    delay: Duration | None = None

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, value: str) -> str:
        return queue_name(value)

    @field_validator("group")
    @classmethod
    def _group_key(cls, value: str | None) -> str | None:
        return None if value is None else group_key(value)

    @field_validator("run_at", mode="wrap")
    @classmethod
    def _run_at_bounded(cls, value: object, handler: Any) -> datetime | None:
        try:
            if not (value is None or isinstance(value, datetime)
                    or (isinstance(value, str) and RFC3339.fullmatch(value))):
                raise ValidationError.from_exception_data("run_at", [])  # a Unix time, say
            parsed: datetime | None = handler(value)
        except ValidationError:
            raise ValueError(f"{str(value)[:60]!r} is not an RFC 3339 timestamp with an "
                             "offset (e.g. 2026-11-23T18:00:00Z)") from None
        value = parsed
        if value is not None:
            now = datetime.now(UTC)
            if not now - MAX_DURATION <= value <= now + MAX_DURATION:
                raise ValueError("must be within 100 years of now")
        return value

    @model_validator(mode="after")
    def _one_schedule(self) -> JobSpec:
        if self.run_at is not None and self.delay is not None:
            raise ValueError("give run_at or delay, not both")
        if self.expires_in is not None:
            _starts_before_it_expires(self.expires_in, self.run_at, self.delay)
        return self

    @field_validator("labels")
    @classmethod
    def _label_sizes(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if not 1 <= len(key) <= 253:
                raise ValueError(f"label key {key[:40]!r} must be 1 to 253 characters")
            if len(value) > 1000:
                raise ValueError(f"label {key!r}: the value is longer than 1000 characters")
        return labels

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs_url(cls, v: object) -> object:
        if isinstance(v, Mapping) and "steps" in v:
            raise ValueError("inputs from steps name the steps before it in a workflow: "
                             "only a workflow's step takes them (a job's inputs are an "
                             "s3:// url)")
        return {"url": v} if isinstance(v, str) else v

    @field_validator("actions")
    @classmethod
    def _known_actions(cls, actions: list[ActionSpec]) -> list[ActionSpec]:
        # Resolve names and normalize params now: an unknown action is an input error.
        out = []
        for a in actions:
            params = _validated(a.name, _canonical(a.params))
            out.append(a if params == a.params else a.model_copy(update={"params": params}))
        return out

    def stored_actions(self) -> list[dict[str, Any]]:
        """The actions as a job keeps them: each with its inactivity timeout (its own, else
        the job's), which the worker's guard enforces."""
        stored = []
        for a in self.actions:
            action: dict[str, Any] = {"name": a.name, "params": a.params}
            quiet = a.inactivity_timeout or self.inactivity_timeout
            if quiet is not None:
                action["inactivity_timeout"] = format_duration(quiet)
            stored.append(action)
        return stored

    def fingerprint(self) -> str:
        """Hash of everything but the idempotency key: a repeated key must carry the
        same spec, or it is a conflict."""
        body = self.model_dump(mode="json", exclude={"idempotency_key"} | (
            {"group"} if self.group is None else set()))  # as before groups were
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _starts_before_it_expires(expires_in: timedelta, run_at: datetime | None,
                              delay: timedelta | None) -> None:
    """Refuse a job that would expire before it may start: lifecycle could only ever cancel
    it. ``expires_in`` counts from the enqueue, which comes after this check — so a job
    that passes here starts before it expires in the database too (which checks again,
    by its own clock: ``Jobs.insert_many``)."""
    said = f"expires_in {format_duration(expires_in)}"
    if delay is not None and expires_in <= delay:
        raise ValueError(f"{said} is not longer than its delay {format_duration(delay)}: "
                         "the job would expire before it may start")
    if run_at is not None:
        ends = datetime.now(UTC) + expires_in
        if ends <= run_at:
            raise ValueError(f"{said} ends at {ends:%Y-%m-%dT%H:%M:%SZ}, not after its "
                             f"run_at {run_at.isoformat()}: the job would expire before it "
                             "may start")


_CANONICAL = json.JSONEncoder(sort_keys=True, default=str)
"""One encoder for every spec (``json.dumps`` with arguments makes one a call)."""


def _canonical(params: Mapping[str, Any]) -> str:
    return _CANONICAL.encode(params)


@lru_cache(maxsize=1024)
def _validated(name: str, params: str) -> dict[str, Any]:
    """An action's normalized params, validated once per distinct (name, params): a list of
    10k specs usually repeats a handful of actions. Callers never mutate the result."""
    return get_action(name).validate(json.loads(params))


def seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def _describe(exc: ValidationError, where: str) -> str:
    problems = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        problems.append(f"{loc}: {msg}" if loc else msg)
    return f"{where}: " + "; ".join(problems)


def parse_specs(data: object) -> list[JobSpec]:
    """One spec or a list of them, held whole (an API body, a YAML text), each validated;
    InvalidSpec names the first bad one.

    The whole input is walked first (``jobfence.limits.check_structure``): nothing that JSON or
    PostgreSQL cannot hold, nothing nested too deep, nothing that expands past the node
    budget, reaches the model or the canonical JSON of a spec."""
    try:
        check_structure(data)
    except Unstorable as exc:
        raise InvalidSpec(str(exc)) from None
    items: Sequence[object] = data if isinstance(data, list) else [data]
    if not items:
        raise InvalidSpec("the spec list is empty")
    if len(items) > MAX_SPECS_PER_CALL:
        raise InvalidSpec(f"at most {MAX_SPECS_PER_CALL} specs per call, got {len(items)} "
                          "(a JSON list given to `enqueue --spec` may be of any length)")
    checking = Checking()
    listed = isinstance(data, list)
    specs = [checking.spec(item, f"spec #{i}" if listed else "spec", walked=True)
             for i, item in enumerate(items)]
    checking.resources(specs, listed=listed)
    return specs


class Checking:
    """The checks of one call's specs, spec by spec (``spec``) and then a batch at a time
    (``resources``): a list given whole or read as a stream is held to the same rules. An
    idempotency key at most once in the call (the keys seen are kept: text, not specs);
    each resource checked once per distinct (action, params, resource) while that is few."""

    RESOURCES_KEPT = 10_000

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.checked: set[tuple[str, str, str | None]] = set()
        self.count = 0

    def spec(self, item: object, where: str, *, walked: bool = False) -> JobSpec:
        """One spec's data validated (its structure first, unless ``walked`` already)."""
        if not isinstance(item, Mapping):
            raise InvalidSpec(f"{where}: expected a JSON object, got {type(item).__name__}")
        if "workflow" in item:
            raise InvalidSpec(f"{where}: a workflow is enqueued on its own (one object), "
                              "not in a list nor as a step")
        if not walked:
            try:
                check_structure(item, where)
            except Unstorable as exc:
                raise InvalidSpec(str(exc)) from None
        try:
            spec = JobSpec.model_validate(item)
        except ValidationError as exc:
            raise InvalidSpec(_describe(exc, where)) from None
        key = spec.idempotency_key
        if key is not None:
            if key in self.keys:
                raise InvalidSpec(f"{where}: idempotency key appears twice in one call: "
                                  f"{key[:200]!r}")
            self.keys.add(key)
        return spec

    def resources(self, specs: Sequence[JobSpec], *, listed: bool = True) -> None:
        """Let each action that checks resources (``jobfence.actions.ResourceValidator``)
        check its job's ``resource``; InvalidSpec names the first spec refused and says
        why. After every other check of the batch: a plugin's look (a catalog, an API) is
        never paid for a spec refused anyway. ``specs`` are the call's next ones."""
        first, self.count = self.count, self.count + len(specs)
        if len(self.checked) > self.RESOURCES_KEPT:
            self.checked.clear()
        for i, spec in enumerate(specs, start=first):
            for action in spec.actions:
                # A ResourceValidator's one method, looked up (the Protocol's runtime
                # isinstance costs more than the rest of a spec's checks)
                check = getattr(get_action(action.name), "validate_resource", None)
                if not callable(check):
                    continue  # most actions: no key made (an encode of its params)
                key = (action.name, _canonical(action.params), spec.resource)
                if key in self.checked:
                    continue
                try:
                    check(spec.resource, action.params)
                except (InvalidSpec, ValueError) as exc:
                    where = f"spec #{i}" if listed else "spec"
                    shown = "no resource" if spec.resource is None else \
                        f"resource {spec.resource[:200]!r}"
                    raise InvalidSpec(f"{where}: {shown}: action {action.name!r}: "
                                      f"{str(exc)[:2000]}") from None
                self.checked.add(key)


def _yaml_loader() -> type:
    """PyYAML's safe loader without the implicit timestamp type: an unquoted
    ``2026-01-01T00:00:00Z`` stays the text a JSON spec would carry. Aliases are allowed
    (they are handy for repeated params) and counted by ``check_structure``."""
    import yaml

    class SpecLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            # PyYAML keeps the last of a key given twice, silently: a step named twice.
            # (A merge's keys, `<<: *x`, may be given again: that is what a merge is for.)
            keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)
                    and k.tag != "tag:yaml.org,2002:merge"]
            repeated = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
            if repeated is not None:
                raise InvalidSpec(f"{str(repeated)[:70]!r} is named twice in one mapping")
            return super().construct_mapping(node, deep=deep)

    SpecLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers
                if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    return SpecLoader


def decode_spec_bytes(data: bytes, source: str = "spec") -> str:
    """Spec text from bytes: at most ``MAX_SPEC_BYTES``, UTF-8."""
    if len(data) > MAX_SPEC_BYTES:
        raise InvalidSpec(f"{source}: larger than {MAX_SPEC_BYTES // (1024 * 1024)} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidSpec(f"{source}: not UTF-8 text (byte {exc.start})") from None


def parse_spec_text(text: str, source: str = "spec") -> list[JobSpec]:
    """Specs from JSON, or YAML when the text is not JSON."""
    return parse_specs(load_spec_text(text, source))


def load_spec_text(text: str, source: str = "spec") -> object:
    """The data of a spec text: JSON, or YAML when the text is not JSON (not yet
    validated)."""
    if len(text) > MAX_SPEC_BYTES:
        raise InvalidSpec(f"{source}: larger than {MAX_SPEC_BYTES // (1024 * 1024)} MiB")
    try:
        data = json.loads(text)
    except RecursionError:
        raise InvalidSpec(f"{source}: nested too deep") from None
    except ValueError as json_exc:  # JSONDecodeError, or an integer of too many digits
        where = (f"{json_exc.msg} at line {json_exc.lineno}"
                 if isinstance(json_exc, json.JSONDecodeError) else str(json_exc))
        try:
            import yaml

            data = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a safe loader
        except RecursionError:
            raise InvalidSpec(f"{source}: nested too deep") from None
        except InvalidSpec as exc:
            raise InvalidSpec(f"{source}: {exc}") from None
        except Exception:
            raise InvalidSpec(f"{source}: not valid JSON ({where}) nor YAML") from None
        if isinstance(data, str | int | float) or data is None:
            raise InvalidSpec(f"{source}: not valid JSON ({where})") from None
    return data


def parse_action_arg(arg: str) -> dict[str, Any]:
    """``NAME`` or ``NAME:JSON_PARAMS`` from the command line."""
    name, sep, raw = arg.partition(":")
    if not name:
        raise InvalidSpec(f"action {arg[:80]!r}: missing name")
    if not sep:
        return {"name": name, "params": {}}
    try:
        params = json.loads(raw)
    except RecursionError:
        raise InvalidSpec(f"action {name[:80]!r}: params are nested too deep") from None
    except ValueError as exc:
        why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise InvalidSpec(f"action {name[:80]!r}: params are not valid JSON ({why})") from None
    if not isinstance(params, dict):
        raise InvalidSpec(f"action {name[:80]!r}: params must be a JSON object")
    return {"name": name, "params": params}
