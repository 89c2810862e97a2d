"""The kustomize base rendered once per session with `kubectl kustomize manifests/`, and
with the alerts component."""

from __future__ import annotations

import copy

import pytest

from tests.support.manifests import Obj, render, render_with


@pytest.fixture(scope="session")
def base() -> list[Obj]:
    return render()


@pytest.fixture(scope="session")
def with_alerts() -> list[Obj]:
    """The base with the alerts component (its PrometheusRule)."""
    return render_with("alerts")


@pytest.fixture
def objects(base: list[Obj]) -> list[Obj]:
    """A copy of the rendered base that a test may change."""
    return copy.deepcopy(base)
