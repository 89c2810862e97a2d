"""Built-in actions: ``sleep`` and ``command``.

``command`` runs an argv in its own process group so that the whole tree can be killed at
once — by the action itself on timeout, or by the worker's heartbeat or SIGTERM watcher
from another thread when the attempt must stop.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from jobfence.actions import Action, ActionContext, StopRequested
from jobfence.durations import Duration
from jobfence.errors import InvalidSpec

TAIL_BYTES = 4096


class ActionFailed(Exception):
    """The action ran and failed; ``detail`` carries what helps a person (stderr tail)."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail


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


class _Tail:
    """Keeps the last TAIL_BYTES of a stream, read on a thread so the pipe never fills."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[bytes]) -> None:
        with stream:
            for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
                self._chunks.append(chunk)
                self._size += len(chunk)
                while self._size - len(self._chunks[0]) >= TAIL_BYTES:
                    self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        self._thread.join(timeout=2)
        data = b"".join(self._chunks)[-TAIL_BYTES:]
        return data.decode("utf-8", errors="replace")


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL me if the worker dies, even by SIGKILL (Linux).
    Only an async-signal-safe libc call runs here."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
    _PR_SET_PDEATHSIG = 1
    _PREEXEC: Callable[[], None] | None = _die_with_parent if sys.platform == "linux" else None
except (AttributeError, OSError):
    _PREEXEC = None


def kill_group(pgid: int) -> None:
    """SIGKILL a whole process group; gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class CommandAction:
    """Run ``argv`` (no shell unless the argv asks for one) in the job's sandbox
    (``jobfence.sandbox``: its own environment, another user when the worker is root): the
    job's S3 inputs are downloaded into JOBFENCE_INPUT_DIR first, and what the command
    writes into JOBFENCE_OUTPUT_DIR is uploaded when it exits 0."""

    name = "command"
    poll_seconds = 0.05

    def validate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return _validated(CommandParams, self.name, params)

    def run(self, ctx: ActionContext, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        p = CommandParams.model_validate(params)
        env = ctx.sandbox.environment(ctx.env, p.env, ctx.workdir)
        ctx.check_stop()
        inputs, outputs = ctx.input_dir, ctx.output_dir  # the child may use both: make them
        if ctx.files is not None:
            ctx.files.download_inputs(inputs)
            ctx.check_stop()
        ctx.sandbox.hand_over(ctx.dirs.root)
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                p.argv, cwd=ctx.workdir, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=_PREEXEC,  # noqa: PLW1509 - a single prctl call, no locks
                **ctx.sandbox.popen_args(),
            )
        except OSError as exc:
            raise ActionFailed(f"cannot start {p.argv[0]!r}: {exc.strerror or exc}") from exc
        ctx.track_process(proc.pid)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = _Tail(proc.stdout), _Tail(proc.stderr)
        deadline = started + p.timeout.total_seconds() if p.timeout else None
        try:
            code = self._wait(proc, ctx, deadline, p.timeout)
        finally:
            kill_group(proc.pid)   # grandchildren left behind by the child die with it
            proc.wait()
            ctx.untrack_process(proc.pid)
        stdout, stderr = out.text(), err.text()
        result: dict[str, Any] = {
            "exit_code": code, "duration_seconds": round(time.monotonic() - started, 3),
            "stdout_tail": stdout, "stderr_tail": stderr}
        if code != 0:
            last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
            raise ActionFailed(f"command exited with {code}" + (f": {last}" if last else ""),
                               detail=stderr)
        ctx.check_stop()
        if ctx.files is not None:
            result["outputs"] = ctx.files.publish_outputs(outputs)
        return result

    def _wait(self, proc: subprocess.Popen[bytes], ctx: ActionContext, deadline: float | None,
              timeout: timedelta | None) -> int:
        while True:
            try:
                return proc.wait(timeout=self.poll_seconds)
            except subprocess.TimeoutExpired:
                pass
            if ctx.stop.is_set():
                kill_group(proc.pid)
                raise StopRequested("stopped while the command ran")
            if deadline is not None and time.monotonic() >= deadline:
                kill_group(proc.pid)
                raise ActionFailed(f"command timed out after {timeout}")


BUILTINS: dict[str, Action] = {"sleep": SleepAction(), "command": CommandAction()}
