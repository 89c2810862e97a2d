"""Every benchmark `make bench` lists can be imported and run (the figures themselves are
measured by `make bench`, never asserted in tests)."""

from __future__ import annotations

import importlib

from bench.run import BENCHMARKS


def test_every_registered_benchmark_has_a_run_function() -> None:
    for name, module in BENCHMARKS.items():
        assert callable(getattr(importlib.import_module(module), "run", None)), name
