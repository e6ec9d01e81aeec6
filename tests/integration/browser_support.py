"""What the dashboard's browser tests share: Debian's chromium found (or the module
skipped outside CI, failed in it), Playwright imported, and the generators behind
their fixtures: one headless browser, one 3-node cluster with admin endpoints.

Playwright's own browser download is never used (``executable_path``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

# Re-exported: the dashboard tests take their cluster from here with the browser.
from tests.integration.test_admin_http import running_admin_cluster as running_admin_cluster

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# scripts/test installs chromium (as root) and the dev extra Playwright: in CI a missing one
# fails the module instead of skipping it, so the browser tests cannot vanish silently.
if os.environ.get("CI") != "true":
    pytest.importorskip("playwright.sync_api")
    if CHROMIUM is None:
        pytest.skip("no chromium here (apt-get install chromium)", allow_module_level=True)
assert CHROMIUM is not None, "CI must have chromium (scripts/test installs it as root)"
import playwright.sync_api as playwright_api  # noqa: E402

#: Generous: a 2-core machine shared with other test processes.
DOM_TIMEOUT_MS = 30_000


def headless_chromium() -> Iterator[Any]:
    """One headless chromium for a fixture to yield; closed after."""
    with playwright_api.sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start;
        # --disable-dev-shm-usage: a container's small /dev/shm would crash its renderer.
        args = ["--no-sandbox", "--disable-dev-shm-usage"]
        b = p.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            yield b
        finally:
            b.close()
