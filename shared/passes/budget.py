"""Bounded work for a periodic pass: each step gets at most ``MAX_BATCHES`` database batches
(the next scheduled run carries on), and the longest batch is measured — an upper bound on
the longest transaction the pass held."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

MAX_BATCHES = 200
"""Per step and pass. With the default batch of 500, one pass moves 100k rows per step."""


class Budget:
    def __init__(self, max_batches: int | None = None,
                 checkpoint: Callable[[], None] = lambda: None) -> None:
        """``checkpoint`` runs before each budgeted batch: a pass asked to stop stops
        there, between two batches."""
        self.max_batches = MAX_BATCHES if max_batches is None else max_batches
        self.checkpoint = checkpoint
        self.left = self.max_batches
        self.batches = 0
        self.longest = 0.0

    def new_step(self) -> None:
        """Each step of a pass gets its own ``max_batches``."""
        self.left = self.max_batches

    def __bool__(self) -> bool:
        return self.left > 0

    def batch(self, verb: Callable[..., T], **kwargs: object) -> T:
        """Run one store verb that is one short database batch, against the budget."""
        self.checkpoint()
        self.left -= 1
        return self.timed(verb, **kwargs)

    def pages(self, verb: Callable[..., T], *, size: int, count: Callable[[T], int],
              new_step: bool = True, **kwargs: object) -> Iterator[T]:
        """One step of a pass: ``verb``'s batches in turn, each yielded, until one holds fewer
        than ``size`` rows (``count`` says how many a batch's answer holds) or the budget is
        spent — the next scheduled run carries on from there."""
        if new_step:
            self.new_step()
        while self:
            page = self.batch(verb, **kwargs)
            yield page
            if count(page) < size:
                return

    def timed(self, verb: Callable[..., T], **kwargs: object) -> T:
        """Run one store verb that is one short database batch, timed and counted, off the
        budget (what must happen once a batch's objects are gone)."""
        self.batches += 1
        started = time.perf_counter()
        try:
            return verb(**kwargs)
        finally:
            self.longest = max(self.longest, time.perf_counter() - started)
