"""SIGTERM handling as a context manager that restores the previous handlers.

The handler itself only sets an event. A watcher thread runs the clean-up, so it runs even
while the main thread is blocked inside an action. Python
as PID 1 in a container ignores SIGTERM unless a handler is installed: this is it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def on_termination(cleanup: Callable[[int], None]) -> Iterator[threading.Event]:
    """Within the block, SIGTERM/SIGINT set the yielded event and run ``cleanup(signum)``
    once on a watcher thread. Previous handlers are restored on exit."""
    received = threading.Event()
    leaving = threading.Event()
    signum_box: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if not signum_box:
            signum_box.append(signum)
        received.set()
        wake.set()

    wake = threading.Event()

    def watcher() -> None:
        wake.wait()
        if received.is_set() and not leaving.is_set():
            cleanup(signum_box[0])

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    thread = threading.Thread(target=watcher, name="shutdown-watcher", daemon=True)
    thread.start()
    try:
        yield received
    finally:
        if not received.is_set():
            leaving.set()
            wake.set()
        else:
            thread.join()
        for sig, old in previous.items():
            signal.signal(sig, old)
