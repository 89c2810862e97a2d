"""Built-in actions: ``sleep`` and ``command``.

``command`` runs an argv in its own process group so that the whole tree can be killed at
once — by the action itself on timeout or stop, or by the worker's heartbeat or SIGTERM
watcher from another thread when the attempt must stop. Where the child runs (here, or in
the command sidecar) is not the action's business: it drives the child protocol of
``jobfence.actions.child``, whichever the worker was wired with.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from jobfence.actions import Action, ActionContext, ActionFailed, Snooze, StopRequested, snooze
from jobfence.actions.child import Child, ChildLost, ChildNotStarted, ChildOutput
from jobfence.durations import Duration
from jobfence.errors import InvalidSpec
from jobfence.fsboundary import BoundaryError


def _validated(model: type[BaseModel], name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return model.model_validate(params).model_dump(mode="json", exclude_none=True)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'params'}: "
            f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
        raise InvalidSpec(f"action {name!r}: {problems}") from None


class SleepParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float = Field(ge=0, le=7 * 86400)


class SleepAction:
    """Wait ``seconds``; stops at once when the attempt is told to stop."""

    name = "sleep"

    def validate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return _validated(SleepParams, self.name, params)

    def run(self, ctx: ActionContext, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        seconds = float(params["seconds"])
        if ctx.stop.wait(seconds):
            raise StopRequested("stopped during sleep")
        return {"slept_seconds": seconds}


MAX_ARG_BYTES = 128 * 1024
"""Linux's limit on one argument or environment string (MAX_ARG_STRLEN)."""
MAX_EXEC_BYTES = 1024 * 1024
"""argv and env together: well under the kernel's ARG_MAX beside the worker's environment."""


class CommandParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    argv: list[str] = Field(min_length=1, max_length=10_000)
    env: dict[str, str] = Field(default_factory=dict, max_length=1000)
    timeout: Duration | None = None

    @field_validator("argv")
    @classmethod
    def _argv(cls, argv: list[str]) -> list[str]:
        if not argv[0]:
            raise ValueError("the program (argv[0]) must not be empty")
        for i, arg in enumerate(argv):
            if len(arg.encode()) > MAX_ARG_BYTES:
                raise ValueError(f"argv[{i}] is longer than {MAX_ARG_BYTES} bytes")
        return argv

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not name or "=" in name:
                raise ValueError(f"{name!r} is not an environment variable name "
                                 "(non-empty, without '=')")
            if len(name.encode()) + len(value.encode()) + 1 > MAX_ARG_BYTES:
                raise ValueError(f"{name}: longer than {MAX_ARG_BYTES} bytes")
        return env

    @model_validator(mode="after")
    def _size(self) -> CommandParams:
        total = sum(len(a.encode()) + 1 for a in self.argv) + sum(
            len(k.encode()) + len(v.encode()) + 2 for k, v in self.env.items())
        if total > MAX_EXEC_BYTES:
            raise ValueError(f"argv and env together are longer than {MAX_EXEC_BYTES} bytes")
        return self


class CommandAction:
    """Run ``argv`` (no shell unless the argv asks for one) in the job's sandbox
    (its own environment, a user of its own when the worker is root) and space (a
    ``JobSpace``): the job's S3 inputs are downloaded into
    JOBFENCE_INPUT_DIR before its first command, and the regular files the command writes
    into JOBFENCE_OUTPUT_DIR are uploaded when it exits 0 — anything else found there is
    refused, and the result says what and why (``outputs_refused``). Its stdout and stderr
    go to the ``ChildOutput`` the context gives (tails and sizes in the result; the worker's
    also streams them to its log and S3), and the result says what its process tree used
    (``usage``). Exit 75 with a delay in JOBFENCE_SNOOZE_FILE snoozes
    (``jobfence.actions.snooze``)."""

    name = "command"
    poll_seconds = 0.05

    def validate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return _validated(CommandParams, self.name, params)

    def run(self, ctx: ActionContext, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        p = CommandParams.model_validate(params)
        ctx.check_stop()
        output = ctx.output()
        try:
            space, paths = ctx.space.open()  # the child may use inputs/ and outputs/
            env = ctx.child_env.environment(
                {**ctx.env, **snooze.env(paths, ctx.action_index)}, p.env, paths)
            if ctx.files is not None and not ctx.space.inputs_ready:
                ctx.files.download_inputs(space)  # once: later actions see what it left
                ctx.space.inputs_ready = True
            ctx.check_stop()
            started = time.monotonic()
            child = space.start(p.argv, env, output.add)
        except (ChildNotStarted, ChildLost, BoundaryError) as exc:
            raise ActionFailed(str(exc)) from exc
        if child.pgid is not None:
            ctx.track_process(child.pgid)
        deadline = started + p.timeout.total_seconds() if p.timeout else None
        failed: ActionFailed | None = None
        code = None
        try:
            code = self._wait(child, ctx, output, deadline, p.timeout)
        except ActionFailed as exc:  # timed out, or the sidecar went away
            failed = exc
        finally:
            child.close()
            output.close()
            if child.pgid is not None:
                ctx.untrack_process(child.pgid)
            if not child.ended():
                ctx.unconfirmed.set()
        result: dict[str, Any] = {
            "exit_code": code, "duration_seconds": round(time.monotonic() - started, 3),
            **output.result()}
        if (used := child.usage()) is not None:
            result["usage"] = used.as_dict()
        if failed is not None:
            raise ActionFailed(str(failed), failed.detail, result) from failed
        if code == snooze.EXIT_CODE:  # raises Snooze when its file says how long
            try:
                why_not = snooze.asked(space, ctx.action_index)
            except Snooze as asked:
                asked.result = result  # the claim's output is kept with the snooze
                raise
            raise ActionFailed(f"command exited with {code} to snooze, but {why_not}",
                               result["stderr_tail"], result)
        if code != 0 and used is not None and used.oom_killed:
            limit = used.memory_limit_bytes
            raise ActionFailed(
                "command killed by the kernel's out-of-memory killer: its container's memory "
                "limit" + (f" ({limit / 2**20:.0f} MiB)" if limit else "") + " reached",
                detail=result["stderr_tail"], result=result)
        if code != 0:
            stderr = result["stderr_tail"]
            last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
            raise ActionFailed(f"command exited with {code}" + (f": {last}" if last else ""),
                               detail=stderr, result=result)
        ctx.check_stop()
        if ctx.files is not None:
            try:
                result.update(ctx.files.publish_outputs(space).result())
            except (ChildNotStarted, ChildLost, BoundaryError) as exc:
                raise ActionFailed(f"outputs not published: {exc}", result=result) from exc
        return result

    def _wait(self, child: Child, ctx: ActionContext, output: ChildOutput,
              deadline: float | None, timeout: timedelta | None) -> int:
        while True:
            try:
                code = child.wait(self.poll_seconds)
            except ChildLost as exc:
                raise ActionFailed(str(exc)) from exc
            if code is not None:
                return code
            output.tick()
            if ctx.stop.is_set():
                child.kill()
                raise StopRequested("stopped while the command ran")
            if deadline is not None and time.monotonic() >= deadline:
                child.kill()
                raise ActionFailed(f"command timed out after {timeout}")


BUILTINS: dict[str, Action] = {"sleep": SleepAction(), "command": CommandAction()}
