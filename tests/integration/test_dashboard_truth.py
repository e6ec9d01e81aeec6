"""The live view tells the truth about its own freshness (issue 44), in a real headless
Chromium (Debian's ``chromium`` through Playwright, as test_dashboard_browser.py).

The page is opened on a follower's admin endpoint; then its node is killed, cut off from
the other two (they are stopped with SIGSTOP: the page's node loses its leader), or the
leader is killed. The badge (``#conn``) must leave "live" (green) within a deadline and
say why, the page must link to the other members' dashboards, and a leader change must
be shown: those pages are opened with ``?pin=1`` (no automatic switching), as they
judge one node. Unpinned, a page whose node is killed must move its reads to another
member by itself and turn live there, with data written after the kill. Every wait is
on a DOM condition with a deadline (no fixed sleeps); each test has its own cluster,
since each breaks it."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlease.testing import LocalCluster
from raftlease.testing.certs import secure_bundle
from raftlease.testing.cluster import wait_for
from tests.integration.browser_support import (
    DOM_TIMEOUT_MS,
    headless_chromium,
    running_admin_cluster,
)
from tests.integration.test_admin_http import admin_cluster, admin_of, get

pytestmark = pytest.mark.integration

#: How soon the badge must leave "live" once its node is gone or cut off: the page asks
#: every second and calls data stale after 4.5 s; the rest is slack for a busy machine.
STALE_DEADLINE_MS = 15_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from headless_chromium()


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    yield from running_admin_cluster(3)


def _open_live(
    browser: Any, cluster: LocalCluster, node_id: str, pin: bool = True
) -> tuple[Any, list[str]]:
    """A page on ``node_id``'s dashboard (``pin``: with ``?pin=1``, kept on that node),
    once it is live with data from that node and knows all three members; returns it
    and the list its script errors go to."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"http://{admin_of(cluster, node_id)}/ui/" + ("?pin=1" if pin else ""))
    _wait_live(page, node_id)
    page.wait_for_function(
        "() => document.querySelectorAll('#cluster tbody tr .dashboard-link').length === 3",
        timeout=DOM_TIMEOUT_MS,
    )
    return page, errors


def _wait_live(page: Any, node_id: str) -> None:
    page.wait_for_selector("#conn[data-state='live']", timeout=DOM_TIMEOUT_MS)
    page.wait_for_function(
        "node => /^updated [0-9.]+ s ago from /.test(document.getElementById('fresh').textContent)"
        " && document.getElementById('fresh').textContent.endsWith(' from ' + node)",
        arg=node_id,
        timeout=DOM_TIMEOUT_MS,
    )
    assert page.evaluate("() => document.getElementById('switch').hidden") is True


def _record_badge(page: Any) -> None:
    """From now on the page keeps every state its badge shows (``window.badges``)."""
    page.evaluate(
        """() => {
        const conn = document.getElementById('conn');
        window.badges = [];
        window.healed = false;
        const note = () => window.badges.push(
          {state: conn.dataset.state, text: conn.textContent, healed: window.healed});
        new MutationObserver(note).observe(conn, {attributes: true, childList: true});
        }"""
    )


def _wait_origin_known(cluster: LocalCluster, node: str) -> None:
    """Until the other members let ``node``'s admin origin read them (a preflight answer):
    they learn it from that node's status while it lives."""
    origin = f"http://{admin_of(cluster, node)}"
    for other in (n.id for n in cluster.nodes if n.id != node):
        wait_for(
            lambda o=other: (
                get(
                    admin_of(cluster, o),
                    "/ui/api/health",
                    "OPTIONS",
                    {"Origin": origin, "Access-Control-Request-Method": "GET"},
                )[0]
                == 204
            ),
            timeout=30,
            what=f"{other} to learn {node}'s admin origin",
        )


def _follower(cluster: LocalCluster) -> tuple[str, str]:
    leader = cluster.leader_id()
    return leader, next(n.id for n in cluster.nodes if n.id != leader)


@pytest.mark.timeout(60)
def test_killed_node_turns_stale_and_links_to_the_others(
    cluster: LocalCluster, browser: Any
) -> None:
    leader, node = _follower(cluster)
    page, errors = _open_live(browser, cluster, node)
    others = [n.id for n in cluster.nodes if n.id != node]

    cluster.kill_node(node)
    page.wait_for_selector(
        "#conn[data-state='stale'][data-reason='unreachable']", timeout=STALE_DEADLINE_MS
    )
    assert page.inner_text("#conn").startswith("stale: unreachable")
    # The old data is dimmed, and the other members' dashboards are offered, the
    # leader's first (as the page last heard: its node cannot tell it more now).
    assert page.evaluate("() => document.body.dataset.stale") == "yes"
    page.wait_for_selector("#switch:not([hidden]) a.switch-link", timeout=DOM_TIMEOUT_MS)
    links = page.eval_on_selector_all(
        "#switch a.switch-link", "as => as.map(a => [a.dataset.node, a.href])"
    )
    assert [n for n, _ in links] == [leader] + [o for o in others if o != leader]
    for other, href in links:
        assert href == f"http://{admin_of(cluster, other)}/ui/"
    assert node in page.inner_text("#switch")
    # The freshness line keeps naming the node and the time of its last answer.
    assert f"from {node}" in page.inner_text("#fresh")

    # Switching: the link opens the leader's own page, live with its data.
    page.click(f"#switch a.switch-link[data-node='{leader}']")
    _wait_live(page, leader)
    page.wait_for_function(
        "node => { const r = [...document.querySelectorAll('#cluster tbody tr')]"
        ".find(r => r.dataset.node === node); return !!r && r.classList.contains('unreachable'); }",
        arg=node,
        timeout=DOM_TIMEOUT_MS,
    )
    assert errors == []
    page.close()


@pytest.mark.timeout(60)
def test_partitioned_node_turns_stale_and_live_again_when_healed(
    cluster: LocalCluster, browser: Any
) -> None:
    _leader, node = _follower(cluster)
    page, errors = _open_live(browser, cluster, node)
    others = [n.id for n in cluster.nodes if n.id != node]
    _record_badge(page)

    for other in others:  # the page's node keeps running, alone: it loses its leader
        cluster.pause_node(other)
    try:
        page.wait_for_function(
            "() => { const c = document.getElementById('conn'); return c.dataset.state === "
            "'stale' && ['not-ready', 'no-leader'].includes(c.dataset.reason); }",
            timeout=STALE_DEADLINE_MS,
        )
        text = page.inner_text("#conn")
        assert text.startswith(("stale: not ready: ", "stale: no leader")), text
        # The page's node still answers: it is not called unreachable; its view of
        # the others shows them unreachable, and the badge stays stale meanwhile.
        page.wait_for_function(
            "others => others.every(id => { const r = [...document.querySelectorAll("
            "'#cluster tbody tr')].find(r => r.dataset.node === id); "
            "return !!r && r.classList.contains('unreachable'); })",
            arg=others,
            timeout=DOM_TIMEOUT_MS,
        )
        assert page.evaluate("() => document.getElementById('conn').dataset.state") == "stale"
        assert not page.evaluate("() => document.getElementById('switch').hidden")
        assert page.inner_text("#leader").startswith("last known leader ")
        page.evaluate("() => { window.healed = true; }")
    finally:
        for other in others:
            cluster.resume_node(other)

    _wait_live(page, node)
    badges = page.evaluate("() => window.badges")
    first_stale = next(i for i, b in enumerate(badges) if b["state"] == "stale")
    # Never green while cut off: from the first stale badge until healed, no "live".
    green = [b for b in badges[first_stale:] if b["state"] == "live" and not b["healed"]]
    assert green == [], badges
    assert errors == []
    page.close()


@pytest.mark.timeout(60)
def test_leader_change_is_shown(cluster: LocalCluster, browser: Any) -> None:
    leader, node = _follower(cluster)
    page, errors = _open_live(browser, cluster, node)
    page.wait_for_function(
        "node => document.getElementById('leader').dataset.node === node",
        arg=leader,
        timeout=DOM_TIMEOUT_MS,
    )
    term = int(page.evaluate("() => document.getElementById('leader').dataset.term"))
    assert page.inner_text("#leader") == f"leader {leader}, term {term}"

    cluster.kill_node(leader)
    new = str(cluster.wait_for_leader(timeout=30, exclude=leader)["node"])
    page.wait_for_function(
        "([node, term]) => { const l = document.getElementById('leader'); "
        "return l.dataset.node === node && Number(l.dataset.term) > term; }",
        arg=[new, term],
        timeout=DOM_TIMEOUT_MS,
    )
    new_term = int(page.evaluate("() => document.getElementById('leader').dataset.term"))
    _wait_live(page, node)
    assert page.inner_text("#leader") == f"leader {new}, term {new_term}"
    # The list of leaders seen and the timeline mark the change.
    seen = page.eval_on_selector_all(
        "#leaders li", "ls => ls.map(l => [l.dataset.node, Number(l.dataset.term), l.textContent])"
    )
    assert seen[0][:2] == [leader, term]
    assert seen[-1][:2] == [new, new_term] and seen[-1][2].startswith("new leader: ")
    labels = page.eval_on_selector_all(
        "#timeline text.leader-change-label", "ts => ts.map(t => t.textContent)"
    )
    assert f"new leader {new} t{new_term}" in labels
    # The cluster table: the new leader's row, the old one unreachable.
    page.wait_for_function(
        "([node, old]) => { const rows = [...document.querySelectorAll('#cluster tbody tr')]; "
        "const of = id => rows.find(r => r.dataset.node === id); "
        "return !!of(node) && of(node).classList.contains('leader') && "
        "!!of(old) && of(old).classList.contains('unreachable'); }",
        arg=[new, leader],
        timeout=DOM_TIMEOUT_MS,
    )
    assert errors == []
    page.close()


@pytest.mark.timeout(90)
def test_killed_node_page_switches_to_another_node_reads_on_and_moves_back(
    cluster: LocalCluster, browser: Any
) -> None:
    leader, node = _follower(cluster)
    origin = f"http://{admin_of(cluster, node)}"
    # The others must know the page's origin (learned from its node's status while it
    # lives) to let the page read them once that node is gone.
    _wait_origin_known(cluster, node)
    page, errors = _open_live(browser, cluster, node, pin=False)
    assert page.evaluate("() => document.getElementById('reading').hidden") is True

    cluster.kill_node(node)
    # Stale first (the truth about its node), then reading from the leader, the ready
    # member first in line, and live there: no reload.
    page.wait_for_selector(
        "#conn[data-state='stale'][data-reason='unreachable']", timeout=STALE_DEADLINE_MS
    )
    page.wait_for_function(
        "text => { const r = document.getElementById('reading'); "
        "return !r.hidden && r.textContent === text; }",
        arg=f"reading from {leader} ({node} unreachable)",
        timeout=DOM_TIMEOUT_MS,
    )
    _wait_live(page, leader)
    key = "switch/after-kill"
    with cluster.client() as c:
        lease = c.acquire(key, owner="agent-after-kill", ttl=60.0)
        page.wait_for_function(
            "([key, token]) => { const r = [...document.querySelectorAll('#keys tbody tr')]"
            ".find(r => r.dataset.key === key); return !!r && "
            "r.querySelector('.holder').textContent.includes('agent-after-kill') && "
            "r.querySelector('.token').textContent.includes(String(token)); }",
            arg=[key, lease.token],
            timeout=DOM_TIMEOUT_MS,
        )
    assert page.evaluate("() => document.getElementById('conn').dataset.state") == "live"
    assert page.inner_text("#reading") == f"reading from {leader} ({node} unreachable)"
    assert page.evaluate("() => location.origin") == origin  # the same page, not reloaded

    # Its node back, caught up and ready: the page reads from it again (one test with the
    # switch: a second cluster and page for it cost CI ~12 s).
    cluster.start_node(node)
    page.wait_for_function(
        "() => document.getElementById('reading').hidden", timeout=DOM_TIMEOUT_MS
    )
    _wait_live(page, node)
    assert errors == [], json.dumps(errors)
    page.close()


@pytest.mark.timeout(60)
def test_switched_page_sends_its_token_to_the_other_node(browser: Any, tmp_path: Path) -> None:
    """HTTPS and an auth file: the token entered on the page is sent to the member it
    switches to (same cluster, same tokens), which lets the page's https origin read it."""
    bundle = secure_bundle(tmp_path / "certs")
    cluster = admin_cluster(3, **bundle.node_settings())
    try:
        cluster.start()
        leader, node = _follower(cluster)
        origin = f"https://{admin_of(cluster, node)}"
        tls = ssl.create_default_context(cafile=str(bundle.ca_file))
        for other in (n.id for n in cluster.nodes if n.id != node):
            wait_for(
                lambda o=other: (
                    get(
                        admin_of(cluster, o),
                        "/ui/api/health",
                        "OPTIONS",
                        {"Origin": origin, "Access-Control-Request-Method": "GET"},
                        scheme="https",
                        context=tls,
                    )[0]
                    == 204
                ),
                timeout=30,
                what=f"{other} to learn {node}'s admin origin",
            )
        context = browser.new_context(ignore_https_errors=True)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(origin + "/ui/")
        page.wait_for_selector("#auth:not([hidden])", timeout=DOM_TIMEOUT_MS)
        page.fill("#token", bundle.admin_token)
        page.click("#auth button")
        _wait_live(page, node)

        cluster.kill_node(node)
        page.wait_for_function(
            "text => { const r = document.getElementById('reading'); "
            "return !r.hidden && r.textContent === text; }",
            arg=f"reading from {leader} ({node} unreachable)",
            timeout=DOM_TIMEOUT_MS,
        )
        _wait_live(page, leader)
        assert page.evaluate("() => document.getElementById('auth').hidden") is True
        assert errors == [], json.dumps(errors)
        context.close()
    finally:
        cluster.close()
