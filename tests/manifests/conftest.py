"""The kustomize base rendered once per session with `kubectl kustomize manifests/`."""

from __future__ import annotations

import copy

import pytest

from tests.manifests.rendered import Obj, kubectl_available, render


@pytest.fixture(scope="session")
def base() -> list[Obj]:
    if not kubectl_available():
        pytest.skip("kubectl is not installed: the manifest tests render the base with "
                    "`kubectl kustomize manifests/`")
    return render()


@pytest.fixture
def objects(base: list[Obj]) -> list[Obj]:
    """A copy of the rendered base that a test may change."""
    return copy.deepcopy(base)
