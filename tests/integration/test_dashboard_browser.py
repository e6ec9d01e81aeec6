"""The live view (server/http/dashboard.py, server/http/ui/) in a real headless browser:
Debian's ``chromium`` driven by Playwright (``executable_path``: Playwright's own
browser download is never used). One browser and one cluster for the module.

The page is opened on a follower's admin endpoint, so every read it makes is
forwarded to the leader. Leases are taken and released through the Python client;
the assertions wait on DOM conditions with deadlines (no fixed sleeps)."""

from __future__ import annotations

import json
import re
import secrets
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlease.models import Lease
from raftlease.server.auth import token_digest
from raftlease.testing import LocalCluster, wait_for
from raftlease.testing.certs import secure_bundle
from tests.integration.browser_support import (
    DOM_TIMEOUT_MS,
    headless_chromium,
    running_admin_cluster,
)
from tests.integration.test_admin_http import admin_cluster, admin_of

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def view_cluster() -> Iterator[LocalCluster]:
    yield from running_admin_cluster(3)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from headless_chromium()


def _follower_admin(cluster: LocalCluster) -> str:
    leader = cluster.leader_id()
    return admin_of(cluster, next(n.id for n in cluster.nodes if n.id != leader))


def _row(page: Any, key: str) -> str:
    """A JS expression: the key table's row of ``key`` (compared as data, not markup)."""
    return (
        f"[...document.querySelectorAll('#keys tbody tr')]"
        f".find(r => r.dataset.key === {json.dumps(key)})"
    )


def _wait_cell(page: Any, key: str, cell: str, text: str) -> None:
    page.wait_for_function(
        f"() => {{ const r = {_row(page, key)}; "
        f"return !!r && r.querySelector('.{cell}').textContent.includes({json.dumps(text)}); }}",
        timeout=DOM_TIMEOUT_MS,
    )


def _remaining(page: Any, key: str) -> float:
    text = page.evaluate(
        f"() => {{ const r = {_row(page, key)}; "
        f"return r ? r.querySelector('.countdown').textContent : ''; }}"
    )
    return float(str(text).split()[0])


@pytest.mark.timeout(240)
def test_page_follows_holders_waiters_and_releases(
    view_cluster: LocalCluster, browser: Any, tmp_path: Path
) -> None:
    cluster = view_cluster
    addr = _follower_admin(cluster)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"http://{addr}/ui/")
    page.wait_for_selector("#conn[data-state='live']", timeout=DOM_TIMEOUT_MS)
    # The cluster: every member, one leader.
    page.wait_for_function(
        "() => document.querySelectorAll('#cluster tbody tr').length === 3 && "
        "document.querySelectorAll('#cluster tbody tr.leader').length === 1",
        timeout=DOM_TIMEOUT_MS,
    )
    # Each member's event-loop lag, none of them refusing sessions.
    lags = page.evaluate(
        "() => [...document.querySelectorAll('#cluster tbody td.lag')]"
        ".map(td => [td.textContent, td.dataset.overloaded])"
    )
    assert len(lags) == 3 and all(
        re.fullmatch(r"\d+ ms", text) and flag == "no" for text, flag in lags
    ), lags

    key = "view/gpu-0"
    with cluster.client() as c:
        first = c.acquire(key, owner="agent-a", ttl=60.0)
        _wait_cell(page, key, "holder", "agent-a")
        _wait_cell(page, key, "token", str(first.token))
        # The TTL counts down in the page (from the leader's remaining time).
        page.wait_for_function(
            f"() => {{ const r = {_row(page, key)}; "
            "return !!r && /^[0-9.]+ s$/.test(r.querySelector('.countdown').textContent); }",
            timeout=DOM_TIMEOUT_MS,
        )
        before = _remaining(page, key)
        assert 0 < before <= 60.0
        page.wait_for_function(
            f"() => parseFloat({_row(page, key)}.querySelector('.countdown').textContent) "
            f"< {before}",
            timeout=DOM_TIMEOUT_MS,
        )

        # A renewal that is written at once (a new TTL: with keepalives = memory a
        # renewal with the same TTL reaches the log, and the page, when its promise is
        # written, a quarter of a TTL before the logged expiry) restarts the countdown.
        page.wait_for_function(
            f"() => parseFloat({_row(page, key)}.querySelector('.countdown').textContent) < 59",
            timeout=DOM_TIMEOUT_MS,
        )
        expiry = f"view.keys.get({json.dumps(key)}).holders.get({first.token}).expiresAt"
        before_renew = page.evaluate(f"() => {expiry}")
        first = c.renew(first, ttl=61.0)
        # At least 1 s later than before (the countdown was below 59 of 60 s).
        page.wait_for_function(f"() => {expiry} > {before_renew} + 500", timeout=DOM_TIMEOUT_MS)

        # Two waiters, shown in queue order (no watch event: the live refresh).
        granted: dict[str, Lease] = {}

        def wait_for_key(owner: str) -> None:
            with cluster.client() as waiter:
                granted[owner] = waiter.acquire(key, owner=owner, ttl=60.0, wait=120.0)

        threads = []
        for owner in ("agent-b", "agent-c"):
            t = threading.Thread(target=wait_for_key, args=(owner,), daemon=True)
            t.start()
            threads.append(t)
            _wait_cell(page, key, "waiters", owner)
        _wait_cell(page, key, "waiters", "1. agent-b")
        _wait_cell(page, key, "waiters", "2. agent-c")

        # Release: the head of the queue is granted in the same entry.
        c.release(first)
        threads[0].join(timeout=60)
        assert "agent-b" in granted
        _wait_cell(page, key, "holder", "agent-b")
        _wait_cell(page, key, "token", str(granted["agent-b"].token))
        assert granted["agent-b"].token > first.token
        page.wait_for_function(
            f"() => {{ const r = {_row(page, key)}; "
            "return !!r && !r.querySelector('.holder').textContent.includes('agent-a') && "
            "r.querySelector('.waiters').textContent === '1. agent-c'; }",
            timeout=DOM_TIMEOUT_MS,
        )
        c.release(granted["agent-b"])
        threads[1].join(timeout=60)
        _wait_cell(page, key, "holder", "agent-c")
        c.release(granted["agent-c"])
        # A released key with nobody waiting disappears.
        page.wait_for_function(f"() => !{_row(page, key)}", timeout=DOM_TIMEOUT_MS)

        # A lease key that looks like a queue's ("queue:" is also the prefix of task
        # events) is followed like any other: shown on its grant, gone on release.
        queue_like = "queue:deploy/lock"
        odd = c.acquire(queue_like, owner="agent-q", ttl=60.0)
        _wait_cell(page, queue_like, "holder", "agent-q")
        c.release(odd)
        page.wait_for_function(f"() => !{_row(page, queue_like)}", timeout=DOM_TIMEOUT_MS)

        # A pool: units used of the capacity, and which unit indices the holder got.
        pool = c.acquire("view/pool", owner="job-7", ttl=60.0, capacity=4, units=2)
        _wait_cell(page, "view/pool", "units", "2 of 4 [0,1]")
        c.release(pool)

        # Hostile input renders as text: a key and an owner that are markup.
        hostile = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
        evil = c.acquire(hostile, owner='<b onmouseover="window.pwned=3">x</b>', ttl=60.0)
        page.wait_for_function(
            f"() => {{ const r = {_row(page, hostile)}; "
            f"return !!r && r.querySelector('.key').textContent === {json.dumps(hostile)}; }}",
            timeout=DOM_TIMEOUT_MS,
        )
        _wait_cell(page, hostile, "holder", '<b onmouseover="window.pwned=3">x</b>')
        assert page.evaluate("() => window.pwned") is None
        assert (
            page.evaluate("() => document.querySelectorAll('main img, main script, td b').length")
            == 0
        )

        # Sessions and queues, without their capabilities.
        with c.session(owner="sess-owner", ttl=30.0) as session:
            held = session.acquire("view/in-session")
            task_id = c.queue("view-jobs").put("job-1")
            page.wait_for_function(
                "() => [...document.querySelectorAll('#sessions tbody tr')]"
                ".some(r => r.textContent.includes('sess-owner'))",
                timeout=DOM_TIMEOUT_MS,
            )
            page.wait_for_function(
                "() => { const r = [...document.querySelectorAll('#queues tbody tr')]"
                ".find(r => r.dataset.queue === 'view-jobs'); "
                "return !!r && r.querySelector('.ready').textContent === '1'; }",
                timeout=DOM_TIMEOUT_MS,
            )
            # Its ready task's wait (log time), the /metrics age beside the depths.
            oldest = page.evaluate(
                "() => [...document.querySelectorAll('#queues tbody tr')]"
                ".find(r => r.dataset.queue === 'view-jobs').querySelector('.oldest').textContent"
            )
            assert oldest.endswith(" s"), oldest
            _wait_cell(page, "view/in-session", "holder", "sess-owner")
            html = page.content()
            for secret in (held.lease_id, evil.lease_id, session.session_id):
                assert secret not in html
            assert task_id  # a task id is no capability (the attempt id is)

            # The timeline draws the hostile key as text too.
            page.wait_for_function(
                "() => [...document.querySelectorAll('#timeline text.timeline-key')]"
                ".some(t => t.textContent.startsWith('<script>'))",
                timeout=DOM_TIMEOUT_MS,
            )
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
        c.release(evil)
    assert errors == []
    page.close()


@pytest.mark.timeout(240)
def test_page_says_when_a_list_stops_at_its_cap(view_cluster: LocalCluster, browser: Any) -> None:
    """Each list the page shows stops at a cap (5000 leases, 200 keys with waiters,
    1000 sessions, 200 queues). With more than that the page said nothing, and an
    operator could take the first 200 queues for all of them. The answers now name
    the lists that were cut (``truncated``, with ``limits``) and the page shows a
    notice naming them. Shown with the queues, the cheapest cap to pass."""
    from raftlease.server.http.dashboard import LIMITS, MAX_QUEUES

    cluster = view_cluster
    addr = _follower_admin(cluster)
    with cluster.client() as c:
        for i in range(MAX_QUEUES + 1):
            c.queue(f"cap-q{i:03d}").put({"n": i})

    def queues_cut() -> dict[str, Any] | None:
        with urllib.request.urlopen(f"http://{addr}/ui/api/state", timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
        # Queue depths are this follower's own state: it may apply the last put a
        # moment after the leader acknowledged it.
        return answer if "queues" in answer.get("truncated", []) else None

    state = wait_for(queues_cut, 30, "the follower's answer to say the queues were cut")
    assert state["limits"] == LIMITS
    assert "queues" in state["truncated"] and len(state["queues"]) == MAX_QUEUES
    assert "leases" not in state["truncated"] and "sessions" not in state["truncated"]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"http://{addr}/ui/")
    page.wait_for_function(
        "() => { const b = document.getElementById('truncated'); "
        "return !b.hidden && b.dataset.lists.split(' ').includes('queues'); }",
        timeout=DOM_TIMEOUT_MS,
    )
    notice = page.inner_text("#truncated")
    assert f"first {MAX_QUEUES} queues" in notice, notice
    assert page.evaluate("document.querySelectorAll('#queues tbody tr').length") == MAX_QUEUES
    assert errors == []
    page.close()


@pytest.mark.timeout(60)
def test_page_routes_are_safe(view_cluster: LocalCluster) -> None:
    """Static files carry a strict CSP; data answers no lease or session id; hostile
    requests get definite errors."""
    addr = admin_of(view_cluster, view_cluster.nodes[0].id)

    def get(path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(f"http://{addr}{path}", method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    status, headers, body = get("/ui/")
    assert status == 200 and b"app.js" in body
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert get("/ui/app.js")[1]["Content-Type"].startswith("text/javascript")
    assert get("/ui/nope")[0] == 404
    assert get("/ui/api/state", "POST")[0] == 405
    assert get("/ui/api/key")[0] == 400  # no key
    assert get("/ui/api/key?" + "&".join(f"key=k{i}" for i in range(51)))[0] == 400
    with view_cluster.client() as c:
        lease = c.acquire("view/safe", owner="o", ttl=30.0)
        status, _, body = get("/ui/api/state")
        assert status == 200
        state = json.loads(body)
        assert any(h["key"] == "view/safe" for h in state["leases"])
        assert lease.lease_id not in body.decode()
        status, _, body = get("/ui/api/key?key=view/safe&key=view/none")
        assert status == 200
        safe, none = json.loads(body)["keys"]
        assert safe["holders"][0]["token"] == lease.token and none["holders"] == []
        assert lease.lease_id not in body.decode()
        c.release(lease)


@pytest.mark.timeout(240)
def test_secured_page_needs_an_admin_token(
    browser: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With an auth file the data routes need an admin token (401 without a known one,
    403 without the permission); the page asks for it, keeps it in sessionStorage,
    and then shows the cluster over HTTPS."""
    directory = tmp_path_factory.mktemp("view-secure")
    bundle = secure_bundle(directory / "certs")
    reader_token = secrets.token_urlsafe(24)
    with bundle.auth_file.open("a") as f:  # a principal that may read, not administer
        f.write(
            '\n[roles.reader]\npermissions = [{ prefix = "", actions = ["read"] }]\n\n'
            f'[[principals]]\nname = "reader"\ntoken_sha256 = "{token_digest(reader_token)}"\n'
            'roles = ["reader"]\n'
        )
    cluster = admin_cluster(3, **bundle.node_settings())
    try:
        cluster.start()
        addr = _follower_admin(cluster)
        tls = ssl.create_default_context(cafile=str(bundle.ca_file))

        def status_of(path: str, token: str | None = None) -> int:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            request = urllib.request.Request(f"https://{addr}{path}", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=15, context=tls) as response:
                    return int(response.status)
            except urllib.error.HTTPError as err:
                return int(err.code)

        assert status_of("/ui/") == 200  # the page itself holds no data
        routes = ("/ui/api/state", "/ui/api/live", "/ui/api/cluster", "/ui/api/health")
        for route in (*routes, "/ui/api/key?key=k"):
            assert status_of(route) == 401
            assert status_of(route, "not-a-token") == 401
            assert status_of(route, reader_token) == 403
            assert status_of(route, bundle.admin_token) == 200
        # The page's dead-letter retry (the HTTP API's task_retry, a write): not for a
        # stranger, nor for a principal without queue_write.
        for token, expected in ((None, 401), (reader_token, 403)):
            headers = {"Content-Type": "application/json"}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            retry = urllib.request.Request(
                f"https://{addr}/v1/queues/retry",
                data=b'{"queue": "q", "task_id": "t"}',
                method="POST",
                headers=headers,
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(retry, timeout=15, context=tls)
            assert refused.value.code == expected

        context = browser.new_context(ignore_https_errors=True)
        page = context.new_page()
        page.goto(f"https://{addr}/ui/")
        page.wait_for_selector("#auth:not([hidden])", timeout=DOM_TIMEOUT_MS)
        page.fill("#token", reader_token)
        page.click("#auth button")
        page.wait_for_function(
            "() => !document.getElementById('auth').hidden && "
            "document.getElementById('auth-error').textContent.includes('admin')",
            timeout=DOM_TIMEOUT_MS,
        )
        page.fill("#token", bundle.admin_token)
        page.click("#auth button")
        page.wait_for_selector("#conn[data-state='live']", timeout=DOM_TIMEOUT_MS)
        # The members' dashboards (linked when the page goes stale) are HTTPS here too.
        page.wait_for_function(
            "() => { const links = [...document.querySelectorAll('#cluster .dashboard-link')]; "
            "return links.length === 3 && links.every(a => a.href.startsWith('https://')); }",
            timeout=DOM_TIMEOUT_MS,
        )
        assert page.evaluate("() => sessionStorage.getItem('raftlease.token')") == (
            bundle.admin_token
        )
        with cluster.client(token=bundle.admin_token) as c:
            lease = c.acquire("secure/gpu", owner="agent-s", ttl=30.0)
            _wait_cell(page, "secure/gpu", "token", str(lease.token))
            assert lease.lease_id not in page.content()
            assert bundle.admin_token not in page.content()
            c.release(lease)
            page.wait_for_function(f"() => !{_row(page, 'secure/gpu')}", timeout=DOM_TIMEOUT_MS)
        context.close()
    finally:
        cluster.close()
