"""Every test in this folder starts real node processes on 127.0.0.1: the folder marks
them ``integration`` (the fast loop, ``-m "not integration"``, leaves them out), whatever
fixtures they use. tests/conftest.py also marks any test using a cluster fixture, and its
guard fails any unmarked test that starts a node."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark this folder's tests before ``-m`` selects (tryfirst, as in tests/conftest.py)."""
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.integration)
