"""Time-ordered job ids (UUID version 7, RFC 9562), and the identity a worker claims by.

Ordered ids keep the primary-key index append-mostly under heavy enqueue and let `list`
show newest first by walking that index, without a separate index on created_at.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from datetime import UTC, datetime


def uuid7() -> uuid.UUID:
    return _made(time.time_ns() // 1_000_000, int.from_bytes(os.urandom(10), "big"))


def uuid7s(count: int) -> list[uuid.UUID]:
    """``count`` ids at once: one read of the system's randomness for all of them (a read
    per id is a system call each, and lets another thread take the interpreter)."""
    ms = time.time_ns() // 1_000_000
    randomness = os.urandom(10 * count)
    return [_made(ms, int.from_bytes(randomness[i:i + 10], "big"))
            for i in range(0, 10 * count, 10)]


def _made(ms: int, rand: int) -> uuid.UUID:
    value = (ms & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76                               # version 7
    value |= ((rand >> 62) & 0x0FFF) << 64           # rand_a, 12 bits
    value |= 0b10 << 62                              # RFC 4122 variant
    value |= rand & 0x3FFF_FFFF_FFFF_FFFF            # rand_b, 62 bits
    return uuid.UUID(int=value)


def created_at(job_id: uuid.UUID) -> datetime:
    """When a time-ordered id was made (its first 48 bits, in milliseconds)."""
    return datetime.fromtimestamp((job_id.int >> 80) / 1000, UTC)


def parse_job_id(text: str) -> uuid.UUID:
    """A job id from user input; ValueError with a readable message if malformed."""
    try:
        return uuid.UUID(text.strip())
    except (ValueError, AttributeError):
        raise ValueError(f"{text!r} is not a job id (expected a UUID)") from None


def default_worker_id(cluster: str, installation: str | None) -> str:
    """The pod name; for a worker process of the ``local`` cluster started with its
    installation in its environment, ``local:INSTALLATION:HOST:PID`` (the local cluster
    vouches for exactly those); else ``HOST:PID`` (a claim no cluster can vouch for)."""
    pod = os.environ.get("POD_NAME")
    if pod:
        return pod
    host = socket.gethostname()
    if cluster == "local" and installation:
        return f"local:{installation}:{host}:{os.getpid()}"
    return f"{host}:{os.getpid()}"
