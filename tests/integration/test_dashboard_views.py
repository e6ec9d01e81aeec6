"""The live view's detail views (issue 44) in a real headless browser: shared keys in
lanes with meaningful units, holders seeded onto the timeline at page load, a queue's
task view with a dead letter's retry, the filter, and the keys held through a session.

One cluster and one browser for the module (as test_dashboard_browser.py); the page
is opened on a follower's admin endpoint. Every wait is a DOM condition with a
deadline (no fixed sleeps)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from raftlease.models import RW_CAPACITY
from raftlease.testing import LocalCluster
from tests.integration.browser_support import (
    DOM_TIMEOUT_MS,
    headless_chromium,
    running_admin_cluster,
)
from tests.integration.test_dashboard_browser import _follower_admin, _row, _wait_cell

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def views_cluster() -> Iterator[LocalCluster]:
    yield from running_admin_cluster(3)


@pytest.fixture(scope="module")
def views_browser() -> Iterator[Any]:
    yield from headless_chromium()


def _open(browser: Any, cluster: LocalCluster) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"http://{_follower_admin(cluster)}/ui/")
    page.wait_for_selector("#conn[data-state='live']", timeout=DOM_TIMEOUT_MS)
    return page, errors


def _lanes(page: Any, key: str) -> list[dict[str, str]]:
    """The key table's rows of ``key``, one per holder: owner and share."""
    result: list[dict[str, str]] = page.evaluate(
        "key => [...document.querySelectorAll('#keys tbody tr')]"
        ".filter(r => r.dataset.key === key || r.dataset.laneOf === key)"
        ".map(r => ({owner: r.querySelector('.owner') ? r.querySelector('.owner').textContent"
        " : '', share: r.querySelector('.share').textContent}))",
        key,
    )
    return result


def _wait_lanes(page: Any, key: str, count: int) -> None:
    page.wait_for_function(
        "([key, n]) => [...document.querySelectorAll('#keys tbody tr')]"
        ".filter(r => r.dataset.key === key || r.dataset.laneOf === key).length === n",
        arg=[key, count],
        timeout=DOM_TIMEOUT_MS,
    )


def _filter(page: Any, mode: str, text: str) -> None:
    page.select_option("#filter-mode", mode)
    page.fill("#filter-text", text)


def _shown_keys(page: Any) -> list[str]:
    keys: list[str] = page.evaluate(
        "() => [...document.querySelectorAll('#keys tbody tr')]"
        ".filter(r => r.dataset.key !== undefined).map(r => r.dataset.key)"
    )
    return keys


@pytest.mark.timeout(60)
def test_shared_keys_in_lanes_with_units(views_cluster: LocalCluster, views_browser: Any) -> None:
    """A pool shows "U of C" and one row per holder; a read/write lock shows
    "read (N readers)" or "write", never a million units; the timeline draws each
    concurrent holder in its own lane."""
    page, errors = _open(views_browser, views_cluster)
    with views_cluster.client() as c:
        pool = [
            c.acquire("lanes/pool", owner=f"job-{i}", ttl=60.0, capacity=8, units=u)
            for i, u in ((1, 3), (2, 2))
        ]
        readers = [
            c.acquire("lanes/rw", owner=f"reader-{i}", ttl=60.0, capacity=RW_CAPACITY, units=1)
            for i in range(3)
        ]
        writer = c.acquire(
            "lanes/rw-w", owner="writer", ttl=60.0, capacity=RW_CAPACITY, units=RW_CAPACITY
        )
        _wait_cell(page, "lanes/pool", "units", "5 of 8 [0,1,2; 3,4]")
        _wait_lanes(page, "lanes/pool", 2)
        assert _lanes(page, "lanes/pool") == [
            {"owner": "job-1", "share": "3 units [0,1,2]"},
            {"owner": "job-2", "share": "2 units [3,4]"},
        ]
        _wait_cell(page, "lanes/rw", "units", "read (3 readers)")
        _wait_lanes(page, "lanes/rw", 3)
        assert [lane["share"] for lane in _lanes(page, "lanes/rw")] == ["read"] * 3
        _wait_cell(page, "lanes/rw-w", "units", "write")
        assert "1000000" not in page.inner_text("#keys")
        # The timeline: three lanes for the readers' concurrent bars.
        page.wait_for_function(
            "() => new Set([...document.querySelectorAll('#timeline rect.bar')]"
            ".filter(b => b.dataset.key === 'lanes/rw').map(b => b.dataset.lane)).size === 3",
            timeout=DOM_TIMEOUT_MS,
        )
        for lease in [*pool, *readers, writer]:
            c.release(lease)
        page.wait_for_function(f"() => !{_row(page, 'lanes/rw')}", timeout=DOM_TIMEOUT_MS)
    assert errors == []
    page.close()


@pytest.mark.timeout(60)
def test_lease_held_before_page_load_is_on_the_timeline(
    views_cluster: LocalCluster, views_browser: Any
) -> None:
    with views_cluster.client() as c:
        lease = c.acquire("seed/before", owner="early-bird", ttl=60.0)
        page, errors = _open(views_browser, views_cluster)
        page.wait_for_function(
            "() => [...document.querySelectorAll('#timeline rect.bar.seeded')]"
            ".some(b => b.dataset.key === 'seed/before' && b.dataset.owner === 'early-bird')",
            timeout=DOM_TIMEOUT_MS,
        )
        assert page.locator("#timeline path.seeded-mark").count() >= 1
        labels = page.eval_on_selector_all(
            "#timeline text.seeded-label", "ts => ts.map(t => t.textContent)"
        )
        assert any("early-bird" in t for t in labels), labels
        # A lease granted while the page watches is not marked as earlier.
        later = c.acquire("seed/after", owner="late", ttl=60.0)
        page.wait_for_function(
            "() => [...document.querySelectorAll('#timeline rect.bar')]"
            ".some(b => b.dataset.key === 'seed/after' && !b.classList.contains('seeded'))",
            timeout=DOM_TIMEOUT_MS,
        )
        c.release(lease)
        c.release(later)
    assert errors == []
    page.close()


def _post_retry(addr: str, body: bytes, content_type: str) -> int:
    request = urllib.request.Request(
        f"http://{addr}/v1/queues/retry",
        data=body,
        method="POST",
        headers={"Content-Type": content_type},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


@pytest.mark.timeout(60)
def test_queue_task_view_and_dead_letter_retry(
    views_cluster: LocalCluster, views_browser: Any
) -> None:
    page, errors = _open(views_browser, views_cluster)
    with views_cluster.client() as c:
        # A budget for the Budgets table (checked at the end: the 2 s refresh shows it
        # meanwhile, so it adds no wait of its own).
        c.budget_set("views/llm", capacity=20, refill_per_s=0)
        c.spend("views/llm", 7)
        reservation = c.reserve("views/llm", 3, ttl=60.0)
        q = c.queue("views-jobs")
        q.put({"n": 1})
        task = q.claim(worker="worker-7", lease_ttl=60.0)
        assert task is not None
        task.heartbeat(progress=0.4)
        dead_id = q.put({"n": 2}, max_attempts=1)
        doomed = q.claim(worker="worker-8", lease_ttl=60.0)
        assert doomed is not None and doomed.task_id == dead_id
        doomed.fail("disk <full>")
        page.wait_for_function(
            "() => { const r = [...document.querySelectorAll('#queues tbody tr')]"
            ".find(r => r.dataset.queue === 'views-jobs'); "
            "return !!r && r.querySelector('.dead').textContent === '1' && "
            "r.querySelector('.claims').textContent === '2' && "
            "r.querySelector('.dead-letters').textContent === '1'; }",
            timeout=DOM_TIMEOUT_MS,
        )
        page.click("#queues tbody tr[data-queue='views-jobs'] button.queue-open")
        row = f"#qv-tasks tbody tr[data-task='{task.task_id}']"
        page.wait_for_function(
            "sel => { const r = document.querySelector(sel); "
            "return !!r && r.querySelector('.progress').textContent.startsWith('0.4'); }",
            arg=row,
            timeout=DOM_TIMEOUT_MS,
        )
        assert page.inner_text(f"{row} .worker") == "worker-7"
        assert page.inner_text(f"{row} .attempt").startswith("1 of ")
        assert page.inner_text(f"{row} .status") == "claimed"
        assert page.inner_text(f"{row} .heartbeat").endswith(" s ago")
        dead_row = f"#qv-dead tbody tr[data-task='{dead_id}']"
        page.wait_for_selector(dead_row, timeout=DOM_TIMEOUT_MS)
        assert page.inner_text(f"{dead_row} .last-error") == "attempt 1: disk <full>"
        assert task.lease_id not in page.content()  # never an attempt id
        # The retry route (the HTTP API's, on the admin port) refuses what a cross-site
        # form could send.
        addr = _follower_admin(views_cluster)
        body = json.dumps({"queue": "views-jobs", "task_id": dead_id}).encode()
        assert _post_retry(addr, body, "text/plain") == 415
        # The button: the dead letter is ready again.
        page.click(f"{dead_row} button.retry")
        page.wait_for_function(
            "() => document.getElementById('qv-retry').dataset.outcome === 'ok'",
            timeout=DOM_TIMEOUT_MS,
        )
        assert "now ready" in page.inner_text("#qv-retry")
        page.wait_for_function(
            "id => !document.querySelector(`#qv-dead tbody tr[data-task='${id}']`) && "
            "!!document.querySelector(`#qv-tasks tbody tr[data-task='${id}']`)",
            arg=dead_id,
            timeout=DOM_TIMEOUT_MS,
        )
        # A second retry of the same task (no longer dead) is refused, and says so.
        page.evaluate(f"() => retryTask('views-jobs', {json.dumps(dead_id)})")
        page.wait_for_function(
            "() => document.getElementById('qv-retry').dataset.outcome === 'refused'",
            timeout=DOM_TIMEOUT_MS,
        )
        assert "not dead" in page.inner_text("#qv-retry")
        retries = "#queues tbody tr[data-queue='views-jobs'] .retries"
        page.wait_for_function(
            "sel => document.querySelector(sel).textContent === '1'",
            arg=retries,
            timeout=DOM_TIMEOUT_MS,
        )
        task.complete()
        # The budget, from the follower's state; its decision counts are the leader's,
        # and the page says so. The reservation id (a capability) never reaches it.
        budget = "#budgets tbody tr[data-budget='views/llm']"
        page.wait_for_selector(budget, timeout=DOM_TIMEOUT_MS)
        assert page.inner_text(f"{budget} .level-text") == "10 of 20"
        assert page.inner_text(f"{budget} .reservations") == "1"
        assert page.inner_text(f"{budget} .waiting") == "0"
        assert "not the leader" in page.inner_text("#budgets-note")
        assert reservation.reservation_id not in page.content()
        c.settle(reservation, 3)
    assert errors == []
    page.close()


@pytest.mark.timeout(60)
def test_filter_hides_rows_and_says_how_many(
    views_cluster: LocalCluster, views_browser: Any
) -> None:
    """55 keys stay in a box of bounded height; the filter by prefix, owner and
    session hides rows (table and timeline) and says how many."""
    with views_cluster.client() as c:
        leases = [
            c.acquire(f"flt/{'gpu' if i < 5 else 'cpu'}-{i:02d}", owner=f"own-{i % 2}", ttl=60.0)
            for i in range(55)
        ]
        with c.session(owner="flt-sess", ttl=30.0) as session:
            session.acquire("flt/sess-a")
            page, errors = _open(views_browser, views_cluster)
            page.wait_for_function(
                "() => [...document.querySelectorAll('#keys tbody tr')]"
                ".filter(r => (r.dataset.key || '').startsWith('flt/')).length === 56",
                timeout=DOM_TIMEOUT_MS,
            )
            box = page.evaluate(
                "() => { const b = document.getElementById('keys-box'); "
                "return [b.clientHeight, b.scrollHeight]; }"
            )
            assert box[0] < 500 < box[1], box  # scrolls inside its box
            # The whole page stays short (it was 3,700 px with 55 keys).
            assert page.evaluate("() => document.body.scrollHeight") < 2600
            total = page.evaluate("() => view.keys.size")

            _filter(page, "prefix", "flt/gpu")
            page.wait_for_function(
                "() => document.querySelectorAll('#keys tbody tr[data-key]').length === 5",
                timeout=DOM_TIMEOUT_MS,
            )
            assert page.get_attribute("#filter-hidden", "data-hidden") == str(total - 5)
            assert f"{total - 5} of {total} keys hidden" in page.inner_text("#filter-hidden")
            page.wait_for_function(
                "() => [...document.querySelectorAll('#timeline text.timeline-key')]"
                ".every(t => t.textContent.startsWith('flt/gpu'))",
                timeout=DOM_TIMEOUT_MS,
            )

            _filter(page, "owner", "own-1")
            page.wait_for_function(
                "() => document.querySelectorAll('#keys tbody tr[data-key]').length === 27",
                timeout=DOM_TIMEOUT_MS,
            )
            assert all(k.startswith("flt/") for k in _shown_keys(page))

            # By session: its label (from the sessions table) or its owner.
            page.wait_for_function(
                "() => !!document.querySelector(\"#sessions tr[data-owner='flt-sess'] "
                'button.session-filter")',
                timeout=DOM_TIMEOUT_MS,
            )
            page.click("#sessions tr[data-owner='flt-sess'] button.session-filter")
            page.wait_for_function(
                "() => { const keys = [...document.querySelectorAll('#keys tbody tr[data-key]')]"
                ".map(r => r.dataset.key); return keys.length === 1 && keys[0] === 'flt/sess-a'; }",
                timeout=DOM_TIMEOUT_MS,
            )
            assert page.input_value("#filter-mode") == "session"
            assert page.input_value("#filter-text").startswith("s-")
            _filter(page, "session", "flt-sess")
            page.wait_for_function(
                "() => document.querySelectorAll('#keys tbody tr[data-key]').length === 1",
                timeout=DOM_TIMEOUT_MS,
            )
            assert session.session_id not in page.content()
            page.click("#filter-clear")
            page.wait_for_function(
                f"() => document.querySelectorAll('#keys tbody tr[data-key]').length === {total}",
                timeout=DOM_TIMEOUT_MS,
            )
            assert page.inner_text("#filter-hidden") == ""
        for lease in leases:
            c.release(lease)
    assert errors == []
    page.close()


@pytest.mark.timeout(60)
def test_session_lists_its_keys(views_cluster: LocalCluster, views_browser: Any) -> None:
    page, errors = _open(views_browser, views_cluster)
    with views_cluster.client() as c, c.session(owner="keys-sess", ttl=30.0) as session:
        session.acquire("sk/one")
        session.acquire("sk/two")
        sel = "#sessions tr[data-owner='keys-sess'] .session-keys"
        page.wait_for_function(
            "sel => { const cell = document.querySelector(sel); return !!cell && "
            "[...cell.querySelectorAll('.session-key')].map(s => s.textContent).join(' ')"
            " === 'sk/one sk/two'; }",
            arg=sel,
            timeout=DOM_TIMEOUT_MS,
        )
        # The key table names the session each holder holds through.
        _wait_cell(page, "sk/one", "holder", "via s-")
        assert session.session_id not in page.content()
    assert errors == []
    page.close()
