"""This release's version, as installed: ``--version``, the OpenAPI document, traces."""

from __future__ import annotations


def version() -> str:
    """This release's version, as installed; ``unknown`` where the package is not."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("jobfence")
    except PackageNotFoundError:
        return "unknown"
