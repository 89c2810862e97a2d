"""The KEDA operator's cold build (bench.bench_keda.run_build)."""

from __future__ import annotations

from bench.bench_keda import run_build as run

__all__ = ["run"]
