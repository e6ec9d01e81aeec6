"""The dashboard's reading of a member's status (server/http/dashboard.py): the URL of
its page from the admin address it names, and its readiness as far as the status
tells (issue 44)."""

from __future__ import annotations

from types import SimpleNamespace

from raftlease.server.http.dashboard import _dashboard_url, _status_readiness, _task_row


def test_dashboard_url_from_the_admin_address() -> None:
    status = {"admin": "10.0.0.2:7201", "client": "10.0.0.2:7001"}
    assert _dashboard_url(status, "https") == "https://10.0.0.2:7201/ui/"
    # A wildcard bind: the host of its client address instead.
    for wildcard in ("0.0.0.0:7201", "[::]:7201"):
        status = {"admin": wildcard, "client": "node-2.example:7001"}
        assert _dashboard_url(status, "http") == "http://node-2.example:7201/ui/"
    assert _dashboard_url({"admin": "[::1]:7201"}, "http") == "http://[::1]:7201/ui/"
    # None named, a malformed one, or a wildcard with no client host: no link.
    assert _dashboard_url({"admin": None}, "http") is None
    assert _dashboard_url({}, "http") is None
    assert _dashboard_url({"admin": "no-port"}, "http") is None
    assert _dashboard_url({"admin": "0.0.0.0:7201", "client": "0.0.0.0:7001"}, "http") is None


def test_readiness_from_what_the_status_reports() -> None:
    leader = {"role": "leader", "leader": "a:1", "ready": True}
    assert _status_readiness(leader, 1.8) == {"ready": True, "reason": "ready (from its status)"}
    follower = {"role": "follower", "leader": "a:1", "ready": True, "heard_from_leader_ago": 0.1}
    assert _status_readiness(follower, 1.8)["ready"] is True
    silent = {**follower, "heard_from_leader_ago": 2.5}
    verdict = _status_readiness(silent, 1.8)
    assert verdict["ready"] is False and "not heard from the leader for 2.5 s" in verdict["reason"]
    # Without an admin token a member's status has no heard_from_leader_ago: not judged.
    assert _status_readiness(
        {k: v for k, v in follower.items() if k != "heard_from_leader_ago"}, 1.8
    )["ready"]
    assert _status_readiness({**follower, "leader": None}, 1.8) == {
        "ready": False,
        "reason": "no leader is known to this node",
    }
    assert _status_readiness({**follower, "ready": False}, 1.8)["reason"].startswith("still")


def test_task_row_of_the_queue_view() -> None:
    """A claimed task: its attempt, worker, heartbeat age (expiry less TTL), progress and
    the last error its history records; never an attempt id."""
    info = {
        "tid": "t1",
        "status": "claimed",
        "attempts": 2,
        "max_attempts": 5,
        "created_at": 1_000,
        "worker": "w7",
        "progress": 0.4,
        "history": [[1, "w6", 3, 1_100, 1_200, "failed", "disk full"]],
    }
    attempt = SimpleNamespace(
        number=2,
        session="",
        expires_at=70_000,
        ttl_ms=60_000,
        progress=0.4,
        progress_at=9_000,
        aid="secret-attempt-id",
    )
    row = _task_row(info, attempt, 12_000)
    assert row["attempt"] == 2 and row["worker"] == "w7" and row["progress"] == 0.4
    assert row["heartbeat_age"] == 2_000  # extended to 70 s at 10 s, a 60 s TTL
    assert row["progress_age"] == 3_000
    assert row["last_error"] == {"attempt": 1, "error": "disk full"}
    assert "secret-attempt-id" not in repr(row)
    # In a session it lives by the session's keep-alive: no heartbeat age to tell.
    in_session = SimpleNamespace(**{**vars(attempt), "session": "s"})
    assert _task_row(info, in_session, 12_000)["heartbeat_age"] is None
    # A dead letter (no attempt): no error recorded is None, not an empty one.
    dead = _task_row(
        {**info, "status": "dead", "history": [[1, "w", 1, 0, 1, "expired", ""]]}, None, 12_000
    )
    assert dead["last_error"] is None and "attempt" not in dead
