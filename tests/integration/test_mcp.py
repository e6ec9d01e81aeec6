"""``raftlease mcp`` on a real cluster, driven by the official MCP SDK's client over
stdio (``mcp.ClientSession`` + ``stdio_client``), exactly as an agent host runs it:

* the tools are listed with their input schemas;
* claim / renew / release / who_holds / check_token / list_claims / release_all, each
  result carrying the fencing token and the remaining validity;
* a second MCP session's claim fails at once, or waits in the key's queue, while the
  first holds the key, and gets it when the first releases;
* ending the MCP session (stdin closed) releases its claims at once; SIGKILL of the
  server process frees them after the session TTL, never before the keep-alives stop;
* a claim revoked behind the session's back, or lost with its lease session (every
  node paused past the session TTL), is reported lost on the next call and as a log
  message; the next claim opens a new lease session;
* queue tools: take_task / heartbeat / complete_task / fail_task through the MCP
  session's lease session; ending the MCP session gives a taken task back;
* hostile arguments are tool errors with a definite code and change nothing: every
  tool refuses a wrong type, an unknown argument (naming the accepted ones) and an
  out-of-range value in words for a model, never pydantic's text;
* every tool lists behaviour hints, a strict input schema with bounds and a typed
  output schema, and every result's structured content is the text's object;
* a claim of a key the session holds with other units is refused, saying what it holds;
* the logging capability is declared and the level a client sets is honoured;
* on a secured cluster the server uses the CLI's credentials (RAFTLEASE_CA_FILE,
  RAFTLEASE_AUTH_TOKEN) and the principal's permissions apply.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters, stdio_client

from raftlease.testing import LocalCluster, wait_for
from raftlease.testing.certs import secure_bundle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: Session TTL of the MCP servers under test: keep-alives every third of it, so one
#: late by most of a second (a busy 2-core machine) lapses nothing.
SESSION_TTL = 3.0

TOOLS = {
    "claim",
    "claim_many",
    "request_yield",
    "renew",
    "release",
    "release_all",
    "who_holds",
    "list_claims",
    "check_token",
    "audit",
    "take_task",
    "heartbeat",
    "complete_task",
    "fail_task",
    "spend_budget",
    "reserve_budget",
    "settle_budget",
    "begin_effect",
    "commit_effect",
    "put_task",
}


class ToolFailed(Exception):
    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body)
        self.body = body
        self.code = body.get("code")


class Agent:
    """One MCP session with a ``raftlease mcp`` subprocess."""

    def __init__(self, session: ClientSession, owner: str) -> None:
        self.session = session
        self.owner = owner
        self.logs: list[Any] = []

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await self.session.call_tool(tool, arguments)
        text = "".join(getattr(block, "text", "") for block in result.content)
        if result.is_error:
            # "Error executing tool <name>: {json}" for our errors; plain text for the
            # SDK's own (unknown tool, schema violations).
            start = text.find("{")
            try:
                body = json.loads(text[start:]) if start >= 0 else {"message": text}
            except ValueError:
                body = {"message": text}
            raise ToolFailed(body)
        parsed: dict[str, Any] = json.loads(text)
        # Typed output: the structured content is the same object as the text (and
        # the SDK client has checked it against the tool's output schema).
        assert result.structured_content == parsed, (tool, result.structured_content, parsed)
        return parsed

    async def refused(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The tool error's body for a call that must be refused, checked for the
        shape every refusal has and for text written for a model."""
        result = await self.session.call_tool(tool, arguments)
        text = "".join(getattr(block, "text", "") for block in result.content)
        assert result.is_error, (tool, arguments, text)
        prefix = f"Error executing tool {tool}: "
        assert text.startswith(prefix), text
        body: dict[str, Any] = json.loads(text[len(prefix) :])
        assert set(body) <= {"code", "message", "definite", "detail"}, body
        assert body["code"] == "INVALID_ARGUMENT" and body["definite"] is True, body
        for leaked in ("pydantic", "http", "validation error", "Input should", "Arguments"):
            assert leaked not in body["message"], body["message"]
        assert len(body["message"]) < 400, body["message"]
        return body


def server_pid(owner: str) -> int:
    """The pid of the ``raftlease mcp`` process started with ``--owner owner``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mcp" in argv and owner.encode() in argv:
            return int(entry.name)
    raise LookupError(owner)


@asynccontextmanager
async def agent(
    cluster: LocalCluster, owner: str, session_ttl: float = SESSION_TTL, **env: str
) -> AsyncIterator[Agent]:
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "raftlease",
            "mcp",
            "--owner",
            owner,
            "--session-ttl",
            str(session_ttl),
            "--endpoints",
            ",".join(cluster.endpoints),
        ],
        env={**os.environ, **env},
    )
    logs: list[Any] = []

    async def on_log(params: Any) -> None:
        logs.append(params.data)

    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, logging_callback=on_log) as session,
    ):
        await session.initialize()
        a = Agent(session, owner)
        a.logs = logs
        yield a


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ------------------------------------------------------------------ tests


@pytest.mark.timeout(120)
def test_tools_are_listed_with_schemas(shared: LocalCluster) -> None:
    async def main() -> None:
        async with agent(shared, "mcp-list") as a:
            listed = await a.session.list_tools()
            tools = {tool.name: tool for tool in listed.tools}
            assert set(tools) >= TOOLS
            claim = tools["claim"].input_schema
            assert claim["required"] == ["key"]
            assert {"wait", "units", "capacity", "value"} <= set(claim["properties"])
            assert all(tools[name].description for name in TOOLS)

    run(main())


@pytest.mark.timeout(120)
def test_claim_renew_release_and_reads(shared: LocalCluster) -> None:
    async def main() -> None:
        async with agent(shared, "mcp-a") as a:
            got = await a.call("claim", key="mcp/basic")
            assert got["owner"] == "mcp-a" and got["token"] > 0 and got["units"] == 1
            assert "unit_indices" not in got  # a plain lock has no units to name
            assert 0 < got["valid_for"] <= SESSION_TTL
            token = got["token"]
            # Claiming again in the same session returns the same claim.
            again = await a.call("claim", key="mcp/basic")
            assert again["token"] == token and again["already_held"] is True

            renewed = await a.call("renew", key="mcp/basic")
            assert renewed["token"] == token and 0 < renewed["valid_for"] <= SESSION_TTL

            held = await a.call("who_holds", key="mcp/basic")
            assert held["held"] is True
            [holder] = held["holders"]
            assert holder["owner"] == "mcp-a" and holder["token"] == token
            assert holder["mine"] is True and "lease_id" not in json.dumps(held)

            assert (await a.call("check_token", key="mcp/basic", token=token))["current"]
            stale = await a.call("check_token", key="mcp/basic", token=token - 1)
            assert stale["current"] is False

            mine = await a.call("list_claims")
            assert [c["key"] for c in mine["claims"]] == ["mcp/basic"]
            assert mine["session_valid_for"] > 0
            cluster_view = await a.call("list_claims", prefix="mcp/basic")
            assert [h["token"] for h in cluster_view["leases"]] == [token]

            assert (await a.call("release", key="mcp/basic"))["released"] is True
            assert (await a.call("who_holds", key="mcp/basic"))["held"] is False
            assert not (await a.call("check_token", key="mcp/basic", token=token))["current"]
            with pytest.raises(ToolFailed) as err:
                await a.call("release", key="mcp/basic")
            assert err.value.code == "LEASE_NOT_FOUND" and err.value.body["definite"]

            # A new claim gets a higher fencing token.
            later = await a.call("claim", key="mcp/basic")
            assert later["token"] > token
            await a.call("claim", key="mcp/basic-2")
            released = await a.call("release_all")
            assert released["released"] == ["mcp/basic", "mcp/basic-2"]
            assert (await a.call("list_claims"))["claims"] == []

            # The audit trail (no auth here: anyone is admin) has every claim and
            # release of the key, with this session's owner and the tokens.
            trail = await a.call("audit", key="mcp/basic")
            mine_now = [(r[2], r[4]) for r in trail["records"] if r[5] == "mcp-a"]
            assert [m for m in mine_now if m[0] in ("grant", "release")] == [
                ("grant", token),
                ("release", token),
                ("grant", later["token"]),
                ("release", later["token"]),
            ]
            assert trail["node"] and len(trail["head"]) == 64

    run(main())


@pytest.mark.timeout(120)
def test_concurrent_claims_share_one_lease_session(shared: LocalCluster) -> None:
    async def main() -> None:
        async with agent(shared, "mcp-concurrent") as a:
            keys = [f"mcp/concurrent-{i}" for i in range(4)]
            results = await asyncio.gather(*(a.call("claim", key=key) for key in keys))
            assert sorted(r["key"] for r in results) == keys
            with shared.client() as c:
                mine = [s for s in c.sessions() if s.owner == "mcp-concurrent"]
                assert [s.leases for s in mine] == [4], mine
            assert (await a.call("release_all"))["released"] == keys

    run(main())


@pytest.mark.timeout(150)
def test_second_session_fails_or_waits_while_first_holds(shared: LocalCluster) -> None:
    async def main() -> None:
        async with agent(shared, "mcp-first") as a, agent(shared, "mcp-second") as b:
            first = await a.call("claim", key="mcp/contended")
            with pytest.raises(ToolFailed) as err:
                await b.call("claim", key="mcp/contended")
            assert err.value.code == "LEASE_HELD" and err.value.body["definite"]
            assert err.value.body["detail"]["owner"] == "mcp-first"
            # A short wait runs out while the first still holds it.
            started = time.monotonic()
            with pytest.raises(ToolFailed) as err:
                await b.call("claim", key="mcp/contended", wait=0.5)
            assert err.value.code == "LEASE_HELD"
            assert time.monotonic() - started >= 0.4

            # A long wait is granted once the first releases (queued in the cluster).
            waiter = asyncio.create_task(b.call("claim", key="mcp/contended", wait=60))
            await asyncio.sleep(0.5)  # only to let it queue; correctness does not depend on it
            assert not waiter.done()
            await a.call("release", key="mcp/contended")
            second = await asyncio.wait_for(waiter, 30)
            assert second["owner"] == "mcp-second" and second["token"] > first["token"]
            held = await a.call("who_holds", key="mcp/contended")
            assert held["holders"][0]["owner"] == "mcp-second"
            assert held["holders"][0]["mine"] is False

    run(main())


@pytest.mark.timeout(120)
def test_ending_the_mcp_session_releases_at_once(shared: LocalCluster) -> None:
    # A session TTL far longer than the test: freed keys were released, not expired.
    async def main() -> None:
        async with agent(shared, "mcp-leaver", session_ttl=120) as a:
            await a.call("claim", key="mcp/leave-1")
            await a.call("claim", key="mcp/leave-2", capacity=4, units=2)
        # stdin closed: the server closed its lease session before exiting.

    run(main())
    with shared.client() as c:
        assert c.holder("mcp/leave-1", consistency="log") is None
        assert c.holder("mcp/leave-2", consistency="log") is None


@pytest.mark.timeout(120)
def test_sigterm_ends_the_session_and_releases_at_once(shared: LocalCluster) -> None:
    state: dict[str, Any] = {}

    async def main() -> None:
        async with agent(shared, "mcp-terminated", session_ttl=120) as a:
            state["token"] = (await a.call("claim", key="mcp/terminated"))["token"]
            pid = server_pid("mcp-terminated")
            os.kill(pid, signal.SIGTERM)
            state["signalled"] = True
            # The server exits on its own, soon (the lease session closed first).
            deadline = time.monotonic() + 30
            while Path(f"/proc/{pid}").exists() and not _zombie(pid):
                assert time.monotonic() < deadline, "the server did not exit on SIGTERM"
                await asyncio.sleep(0.05)
            state["exited"] = True

    try:
        run(main())
    except Exception:
        # Only the SDK's report of the ended server on the way out is expected.
        if "exited" not in state:
            raise
    with shared.client() as c:
        assert c.holder("mcp/terminated", consistency="log") is None


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


@pytest.mark.timeout(150)
def test_killed_server_frees_its_claims_after_the_session_ttl(shared: LocalCluster) -> None:
    holding: dict[str, Any] = {}

    async def main() -> None:
        async with agent(shared, "mcp-doomed") as a:
            holding.update(await a.call("claim", key="mcp/doomed"))
            pid = server_pid("mcp-doomed")
            # The keep-alives keep the claim well past one TTL.
            await asyncio.sleep(SESSION_TTL * 1.5)
            assert (await a.call("renew", key="mcp/doomed"))["token"] == holding["token"]
            os.kill(pid, signal.SIGKILL)
            holding["killed_at"] = time.monotonic()
            # The client sees the pipe close; leaving the context must not hang.

    try:
        run(main())
    except Exception:
        # The SDK may report the dead server on the way out; anything before the
        # kill (a failed assertion) is a real failure.
        if "killed_at" not in holding:
            raise
    with shared.client() as c:
        holder = c.holder("mcp/doomed")
        # Still held right after the kill (no keep-alive stopped it early)...
        if time.monotonic() - holding["killed_at"] < SESSION_TTL * 0.5:
            assert holder is not None and holder.token == holding["token"]
        # ...and freed by the cluster once the session TTL ran out.
        wait_for(lambda: c.holder("mcp/doomed") is None, SESSION_TTL + 20, "the dead agent's claim")
        assert time.monotonic() - holding["killed_at"] >= SESSION_TTL * 0.5
        lease = c.acquire("mcp/doomed", owner="successor", ttl=5.0)
        assert lease.token > holding["token"]
        c.release(lease)


@pytest.mark.timeout(120)
def test_revoked_claim_is_reported_on_the_next_call(shared: LocalCluster) -> None:
    async def main() -> None:
        async with agent(shared, "mcp-revoked") as a:
            got = await a.call("claim", key="mcp/revoked")
            with shared.client() as c:
                c.revoke("mcp/revoked")
            with pytest.raises(ToolFailed) as err:
                await a.call("renew", key="mcp/revoked")
            assert err.value.code == "LEASE_NOT_FOUND"
            listed = await a.call("list_claims")
            assert listed["claims"] == []
            assert [lost["key"] for lost in listed["lost_claims"]] == ["mcp/revoked"]
            assert listed["lost_claims"][0]["token"] == got["token"]
            # Also sent as a log message (notifications/message) to the client.
            assert any(isinstance(entry, dict) and entry.get("lost_claims") for entry in a.logs), (
                a.logs
            )
            # Reported once; the key can be claimed again.
            assert "lost_claims" not in await a.call("list_claims")
            assert (await a.call("claim", key="mcp/revoked"))["token"] > got["token"]

    run(main())


@pytest.mark.timeout(120)
def test_pool_claims_say_which_units(shared: LocalCluster) -> None:
    async def main() -> None:
        async with agent(shared, "mcp-pool-a") as a, agent(shared, "mcp-pool-b") as b:
            first = await a.call("claim", key="mcp/gpus", capacity=4, units=2)
            second = await b.call("claim", key="mcp/gpus", capacity=4, units=2)
            assert first["units"] == 2 and second["units"] == 2
            assert first["unit_indices"] == [0, 1] and second["unit_indices"] == [2, 3]
            held = await a.call("who_holds", key="mcp/gpus")
            assert (held["capacity"], held["used"]) == (4, 4)
            assert {h["owner"]: h["unit_indices"] for h in held["holders"]} == {
                "mcp-pool-a": [0, 1],
                "mcp-pool-b": [2, 3],
            }
            # Released units are granted again, lowest first.
            await a.call("release", key="mcp/gpus")
            assert (await a.call("claim", key="mcp/gpus", capacity=4, units=1))["unit_indices"] == [
                0
            ]
            with pytest.raises(ToolFailed) as err:
                await a.call("claim", key="mcp/gpus-other", capacity=4, units=5)
            assert err.value.code == "INVALID_ARGUMENT"
            await a.call("release_all")
            await b.call("release_all")

    run(main())


@pytest.mark.timeout(150)
def test_queue_tools_take_heartbeat_complete_and_fail(shared: LocalCluster) -> None:
    with shared.client() as c:
        q = c.queue("mcp-jobs")
        first = q.put({"n": 1})
        second = q.put({"n": 2})

        async def main() -> None:
            async with agent(shared, "mcp-worker") as a:
                taken = await a.call("take_task", queue="mcp-jobs")
                assert taken["task_id"] == first and taken["payload"] == {"n": 1}
                assert taken["token"] > 0 and taken["valid_for"] > 0
                beat = await a.call("heartbeat", task_id=first, progress=0.5)
                assert beat["token"] == taken["token"]
                done = await a.call("complete_task", task_id=first, result={"ok": 1})
                assert done["completed"] is True
                with pytest.raises(ToolFailed) as err:
                    await a.call("complete_task", task_id=first, result=2)
                assert err.value.code == "TASK_NOT_FOUND"

                nxt = await a.call("take_task", queue="mcp-jobs")
                assert nxt["task_id"] == second and "checkpoint" not in nxt
                # A checkpoint saved with a heartbeat is handed to the next attempt.
                await a.call("heartbeat", task_id=second, checkpoint="page 7 of 9 ✓")
                failed = await a.call("fail_task", task_id=second, error="boom", retry_after=0.1)
                assert failed["failed"] is True
                again = await a.call("take_task", queue="mcp-jobs", wait=20)
                assert again["task_id"] == second and again["token"] > nxt["token"]
                assert again["checkpoint"] == "page 7 of 9 ✓"
                assert again["checkpoint_attempt"] == nxt["attempt"]
                assert (await a.call("take_task", queue="mcp-empty"))["task"] is None
            # The MCP session ended holding `second`: given back, not held forever.

        run(main())
        assert q.wait_result(first, timeout=30) == {"ok": 1}
        wait_for(lambda: q.get(second).status == "ready", 30, "the task given back")
        info = q.get(second)
        assert "boom" in info.errors


@pytest.mark.timeout(120)
def test_effect_tools_under_a_claim_and_a_task_and_put_after(shared: LocalCluster) -> None:
    """Issue 41: begin_effect / commit_effect under a claim (the key's journal) and
    under a taken task; a claim revoked behind the agent's back commits nothing
    (definite); put_task with `after` readies the child once its parent completed,
    and take_task shows the parent's result."""

    async def main() -> None:
        async with agent(shared, "mcp-effects") as a:
            got = await a.call("claim", key="mcp/effects/order-17")
            began = await a.call("begin_effect", key="mcp/effects/order-17", effect="charge")
            assert began == {"effect": "charge", "state": "new", "token": got["token"],
                             "key": "mcp/effects/order-17",
                             "idempotency_key": "mcp/effects/order-17:charge"}  # fmt: skip
            done = await a.call(
                "commit_effect", key="mcp/effects/order-17", effect="charge", result={"r": 1}
            )
            assert done["state"] == "committed" and done["already"] is False
            again = await a.call("begin_effect", key="mcp/effects/order-17", effect="charge")
            assert again["state"] == "committed" and again["result"] == {"r": 1}
            await a.call("begin_effect", key="mcp/effects/order-17", effect="mail")
            with shared.client() as c:
                c.revoke("mcp/effects/order-17")
            with pytest.raises(ToolFailed) as err:
                await a.call("commit_effect", key="mcp/effects/order-17", effect="mail")
            assert err.value.code in ("LEASE_NOT_FOUND", "NOT_OWNER")
            assert err.value.body["definite"] is True
            with pytest.raises(ToolFailed) as err:
                await a.call("begin_effect", key="mcp/effects/none", effect="x")
            assert err.value.code == "LEASE_NOT_FOUND"

            parent = (await a.call("put_task", queue="mcp-plan", payload={"step": 1}))["task_id"]
            child = await a.call("put_task", queue="mcp-plan", payload=2, after=[parent])
            taken = await a.call("take_task", queue="mcp-plan")
            assert taken["task_id"] == parent
            began = await a.call("begin_effect", task_id=parent, effect="send",
                                 idempotency_key="mail-1")  # fmt: skip
            assert began["state"] == "new" and began["idempotency_key"] == "mail-1"
            await a.call("commit_effect", task_id=parent, effect="send", result="sent")
            await a.call("complete_task", task_id=parent, result={"ok": True})
            step = await a.call("take_task", queue="mcp-plan", wait=20)
            assert step["task_id"] == child["task_id"] and step["payload"] == 2
            assert step["parent_results"] == {parent: {"ok": True}}
            await a.call("complete_task", task_id=step["task_id"])
            with pytest.raises(ToolFailed) as err:
                await a.call("put_task", queue="mcp-plan", after=["no-such-task"])
            assert err.value.code == "TASK_NOT_FOUND"

    run(main())


@pytest.mark.timeout(180)
def test_a_lost_lease_session_is_reported_and_replaced(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(3)

    async def main() -> None:
        async with agent(cluster, "mcp-cut-off") as a:
            got = await a.call("claim", key="mcp/cut-off")
            # Every node stops: keep-alives fail until the claim's validity runs out.
            for node in cluster.nodes:
                cluster.pause_node(node.id)
            try:
                await asyncio.sleep(SESSION_TTL * 1.5)
            finally:
                for node in cluster.nodes:
                    cluster.resume_node(node.id)
            listed = await a.call("list_claims")
            assert listed["claims"] == []
            [lost] = listed["lost_claims"]
            assert lost["key"] == "mcp/cut-off" and lost["token"] == got["token"]
            assert "lease session lost" in lost["reason"]
            assert any(isinstance(e, dict) and e.get("lost_claims") for e in a.logs)
            # The next claim opens a new lease session (once the cluster has
            # expired the old one, the key is free again).
            deadline = time.monotonic() + 60
            while True:
                try:
                    again = await a.call("claim", key="mcp/cut-off")
                    break
                except ToolFailed as exc:
                    assert exc.code in ("LEASE_HELD", "TIMEOUT", "UNAVAILABLE"), exc.body
                    assert time.monotonic() < deadline, "the key never came free"
                    await asyncio.sleep(0.2)
            assert again["token"] > got["token"] and again["valid_for"] > 0

    run(main())


BAD_ARGUMENTS: list[tuple[str, dict[str, Any]]] = [
    ("claim", {}),
    ("claim", {"key": ""}),
    ("claim", {"key": 7}),
    ("claim", {"key": "k" * 5000}),
    ("claim", {"key": "mcp/bad", "wait": -1}),
    ("claim", {"key": "mcp/bad", "wait": "soon"}),
    ("claim", {"key": "mcp/bad", "wait": 1e9}),
    ("claim", {"key": "mcp/bad", "units": 0}),
    ("claim", {"key": "mcp/bad", "units": 3, "capacity": 2}),
    ("claim", {"key": "mcp/bad", "capacity": 10**12}),
    ("claim", {"key": "mcp/bad", "units": True}),
    ("claim", {"key": "mcp/bad", "value": {"x": 1}}),
    ("claim", {"key": "mcp/bad\x00nul"}),
    ("check_token", {"key": "mcp/bad", "token": -5}),
    ("check_token", {"key": "mcp/bad", "token": "12"}),
    ("check_token", {"key": "mcp/bad", "token": 2**70}),
    ("list_claims", {"prefix": "x", "limit": 0}),
    ("release", {"key": "mcp/never-claimed"}),
    ("renew", {"key": "mcp/never-claimed"}),
    ("take_task", {"queue": ""}),
    ("take_task", {"queue": "q", "wait": -3}),
    ("take_task", {"queue": "q", "capabilities": {"gpu": 1}}),
    ("heartbeat", {"task_id": "nope"}),
    ("complete_task", {"task_id": ""}),
    ("fail_task", {"task_id": "nope", "retry_after": "later"}),
    ("no_such_tool", {}),
]


@pytest.mark.timeout(150)
def test_bad_arguments_are_tool_errors_and_change_nothing(shared: LocalCluster) -> None:
    async def main() -> None:
        async with agent(shared, "mcp-hostile") as a:
            for tool, arguments in BAD_ARGUMENTS:
                with pytest.raises(ToolFailed) as err:
                    await a.call(tool, **arguments)
                assert err.value.body.get("message"), (tool, arguments)
                assert "code" in err.value.body or tool == "no_such_tool", err.value.body
                if "code" in err.value.body:
                    assert err.value.body["definite"] is True, (tool, arguments)
                    assert err.value.body["code"] in (
                        "INVALID_ARGUMENT",
                        "LEASE_NOT_FOUND",
                        "TASK_NOT_FOUND",
                    )
            # The server still works, and nothing was claimed.
            assert (await a.call("list_claims"))["claims"] == []
            assert (await a.call("list_claims", prefix="mcp/bad"))["leases"] == []
            assert (await a.call("claim", key="mcp/bad"))["token"] > 0

    run(main())


#: Every tool, driven with a wrong type, an argument it does not have and an
#: out-of-range value: (tool, arguments, the argument the refusal must name).
#: HELD is a key the agent holds and TASK the task it has taken, so a refusal that
#: went through would change something the test then finds changed.
HELD, QUEUE = "mcp/strict/held", "mcp-strict-jobs"
TASK = "<the taken task>"
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("claim", {"key": 7}, "key"),
    ("claim", {"key": "mcp/strict/ttl", "ttl": 30}, "ttl"),
    ("claim", {"key": "mcp/strict/new", "wait": -1}, "wait"),
    ("claim", {"key": "mcp/strict/new", "wait": 3601}, "wait"),
    ("claim", {"key": "mcp/strict/new", "units": 0}, "units"),
    ("claim", {"key": "mcp/strict/new", "capacity": 10**7}, "capacity"),
    ("claim", {"key": "mcp/strict/new", "units": 1.5}, "units"),
    ("claim", {"key": "mcp/strict/new", "value": "é" * 3000}, "value"),  # 6000 bytes
    ("claim", {"key": "mcp/strict/\x00"}, "key"),
    ("claim_many", {"keys": []}, "keys"),
    ("claim_many", {"keys": "mcp/strict/a"}, "keys"),
    ("claim_many", {"keys": ["mcp/strict/a"], "wait": -1}, "wait"),
    ("claim_many", {"keys": ["mcp/strict/a"], "ttl": 30}, "ttl"),
    ("request_yield", {"key": HELD}, "deadline"),
    ("request_yield", {"key": HELD, "deadline": -1}, "deadline"),
    ("request_yield", {"key": HELD, "deadline": 5, "priority": 10**6}, "priority"),
    ("renew", {"key": 5}, "key"),
    ("renew", {"key": HELD, "ttl": 30}, "ttl"),
    ("renew", {"key": ""}, "key"),
    ("release", {"key": [HELD]}, "key"),
    ("release", {"key": HELD, "force": True}, "force"),
    ("release", {"key": "k" * 5000}, "key"),
    ("release_all", {"force": True}, "force"),
    ("release_all", {"keys": [HELD]}, "keys"),
    ("who_holds", {"key": None}, "key"),
    ("who_holds", {"key": HELD, "consistency": "log"}, "consistency"),
    ("who_holds", {"key": "é" * 2500}, "key"),  # 2,500 characters, 5,000 bytes
    ("list_claims", {"limit": "10"}, "limit"),
    ("list_claims", {"owner": "someone"}, "owner"),
    ("list_claims", {"prefix": "mcp/", "limit": 0}, "limit"),
    ("list_claims", {"prefix": "mcp/", "limit": 1001}, "limit"),
    ("check_token", {"key": HELD, "token": "12"}, "token"),
    ("check_token", {"key": HELD, "token": 1, "lease_id": "x"}, "lease_id"),
    ("check_token", {"key": HELD, "token": -1}, "token"),
    ("check_token", {"key": HELD, "token": 2**63}, "token"),
    ("take_task", {"queue": QUEUE, "wait": "soon"}, "wait"),
    ("take_task", {"queue": QUEUE, "lease_ttl": 5}, "lease_ttl"),
    ("take_task", {"queue": QUEUE, "wait": 3601}, "wait"),
    ("take_task", {"queue": QUEUE, "capabilities": {"gpu": 1}}, "capabilities"),
    (
        "take_task",
        {"queue": QUEUE, "capabilities": {f"c{i}": "x" for i in range(65)}},
        "capabilities",
    ),
    ("take_task", {"queue": "q" * 300}, "queue"),
    ("heartbeat", {"task_id": TASK, "progress": "half"}, "progress"),
    ("heartbeat", {"task_id": TASK, "progress": 0.5, "eta": 3}, "eta"),
    ("heartbeat", {"task_id": TASK, "progress": 1e300}, "progress"),
    ("heartbeat", {"task_id": TASK, "checkpoint": 7}, "checkpoint"),
    ("heartbeat", {"task_id": TASK, "checkpoint": "x" * 8193}, "checkpoint"),
    ("complete_task", {"task_id": 5}, "task_id"),
    ("complete_task", {"task_id": TASK, "result": 1, "status": "done"}, "status"),
    ("complete_task", {"task_id": "t" * 200}, "task_id"),
    ("fail_task", {"task_id": TASK, "error": 5}, "error"),
    ("fail_task", {"task_id": TASK, "requeue": False}, "requeue"),
    ("fail_task", {"task_id": TASK, "retry_after": 301}, "retry_after"),
    ("fail_task", {"task_id": TASK, "retry_after": -1}, "retry_after"),
    ("spend_budget", {"key": "mcp/strict/b", "amount": "3"}, "amount"),
    ("spend_budget", {"key": "mcp/strict/b", "amount": 0}, "amount"),
    ("spend_budget", {"key": "mcp/strict/b", "amount": 10**13}, "amount"),
    ("spend_budget", {"key": "mcp/strict/b", "amount": 1, "wait": 3601}, "wait"),
    ("spend_budget", {"key": "mcp/strict/b", "amount": 1, "owner": "x"}, "owner"),
    ("spend_budget", {"key": 5, "amount": 1}, "key"),
    ("reserve_budget", {"key": "mcp/strict/b", "amount": 0}, "amount"),
    ("reserve_budget", {"key": "mcp/strict/b", "amount": 1, "ttl": 0.5}, "ttl"),
    ("reserve_budget", {"key": "mcp/strict/b", "amount": 1, "ttl": 3601}, "ttl"),
    ("reserve_budget", {"key": "mcp/strict/b", "amount": 1, "owner": "x"}, "owner"),
    ("settle_budget", {"reservation_id": "r", "actual": -1}, "actual"),
    ("settle_budget", {"reservation_id": "r", "actual": "3"}, "actual"),
    ("settle_budget", {"reservation_id": "", "actual": 1}, "reservation_id"),
    ("settle_budget", {"reservation_id": "r", "actual": 1, "key": "k"}, "key"),
    ("begin_effect", {"effect": 5, "key": HELD}, "effect"),
    ("begin_effect", {"effect": "e", "key": HELD, "idempotency_key": "k" * 300}, "idempotency_key"),
    ("begin_effect", {"effect": "e", "key": HELD, "task_id": TASK}, "task_id"),
    ("begin_effect", {"effect": "e", "key": HELD, "lease_id": "x"}, "lease_id"),
    ("commit_effect", {"effect": "e" * 300, "key": HELD}, "effect"),
    ("commit_effect", {"effect": "e", "task_id": TASK, "result": "r" * 2000}, "result"),
    ("commit_effect", {"effect": "e"}, "task_id"),
    ("put_task", {"queue": QUEUE, "after": "t1"}, "after"),
    ("put_task", {"queue": QUEUE, "after": [f"t{i}" for i in range(17)]}, "after"),
    ("put_task", {"queue": QUEUE, "priority": 10**6}, "priority"),
    ("put_task", {"queue": QUEUE, "payload": "x" * 20000}, "payload"),
    ("put_task", {"queue": 5}, "queue"),
    ("audit", {"limit": 0}, "limit"),
    ("audit", {"since": -1}, "since"),
    ("audit", {"key": 5}, "key"),
    ("audit", {"prefix": "x"}, "prefix"),
]


@pytest.mark.timeout(150)
def test_every_tool_refuses_wrong_extra_and_out_of_range_arguments(shared: LocalCluster) -> None:
    """Issue 44: `claim{"key": "z", "ttl": 30}` succeeded with the session's TTL (the
    model believed it set 30 s). Now each tool refuses a wrong type, an unknown argument
    and an out-of-range value, in the tool error shape, naming the argument (and the
    accepted ones for an unknown one), and the cluster is left exactly as it was."""
    assert {tool for tool, _, _ in REFUSED} == TOOLS

    def cluster_state(c: Any, task_id: str) -> Any:
        info = c.queue(QUEUE).get(task_id)
        return (
            sorted((h.key, h.token, h.units) for h in c.leases("mcp/strict/", limit=100)),
            [(s.owner, s.leases) for s in c.sessions() if s.owner == "mcp-strict"],
            (info.status, info.attempts, info.errors, info.token, info.progress),
            c.queue(QUEUE).get(waiting).status,
        )

    with shared.client() as c:
        c.queue(QUEUE).put({"n": 1})
        waiting = c.queue(QUEUE).put({"n": 2})

    async def main() -> None:
        async with agent(shared, "mcp-strict") as a:
            held = await a.call("claim", key=HELD, capacity=4, units=2)
            taken = await a.call("take_task", queue=QUEUE)
            with shared.client() as c:
                before = cluster_state(c, taken["task_id"])
            tools = {t.name: t for t in (await a.session.list_tools()).tools}
            for tool, arguments, argument in REFUSED:
                if arguments.get("task_id") == TASK:
                    arguments = {**arguments, "task_id": taken["task_id"]}
                body = await a.refused(tool, arguments)
                assert argument in body["message"], (tool, arguments, body)
                if argument not in tools[tool].input_schema["properties"]:
                    # An unknown argument: the refusal lists what the tool accepts.
                    accepted = list(tools[tool].input_schema["properties"])
                    assert all(name in body["message"] for name in accepted), body
            # ttl has a word of its own: there is no per-claim ttl to set.
            ttl = await a.refused("claim", {"key": "mcp/strict/ttl", "ttl": 30})
            assert "as long as this MCP session" in ttl["message"], ttl
            with shared.client() as c:
                assert cluster_state(c, taken["task_id"]) == before
            # spend_budget draws when its arguments are right (its refusals are above).
            with shared.client() as c:
                c.budget_set("mcp/strict/b", capacity=3, refill_per_s=0)
            got = await a.call("spend_budget", key="mcp/strict/b", amount=2)
            assert got == {"key": "mcp/strict/b", "amount": 2, "granted": True, "level": 1.0}
            with pytest.raises(ToolFailed) as err:
                await a.call("spend_budget", key="mcp/strict/b", amount=2)
            assert err.value.code == "BUDGET_EXHAUSTED"
            # reserve_budget + settle_budget: an estimate drawn, the difference returned.
            with shared.client() as c:
                c.budget_set("mcp/strict/r", capacity=10, refill_per_s=0)
            reserved = await a.call("reserve_budget", key="mcp/strict/r", amount=6)
            assert reserved["amount"] == 6 and reserved["reservation_id"]
            rid = reserved["reservation_id"]
            done = await a.call("settle_budget", reservation_id=rid, actual=4)
            assert done == {"key": "mcp/strict/r", "reserved": 6, "actual": 4, "level": 6.0}
            with pytest.raises(ToolFailed) as err:
                await a.call("settle_budget", reservation_id=rid, actual=4)
            assert err.value.code == "RESERVATION_NOT_FOUND"
            # The session's own view is unchanged too: the claim and the task are held.
            mine = await a.call("list_claims")
            assert [(m["key"], m["token"], m["units"]) for m in mine["claims"]] == [
                (HELD, held["token"], 2)
            ]
            beat = await a.call("heartbeat", task_id=taken["task_id"])
            assert beat["token"] == taken["token"]
            await a.call("complete_task", task_id=taken["task_id"], result="[1]")
        with shared.client() as c:
            # A string result stays a string (the SDK would have read "[1]" as a list).
            assert c.queue(QUEUE).wait_result(taken["task_id"], timeout=30) == "[1]"

    run(main())


@pytest.mark.timeout(120)
def test_tools_declare_hints_strict_inputs_and_typed_outputs(shared: LocalCluster) -> None:
    read_only = {"who_holds", "list_claims", "check_token", "audit"}
    destructive = {"release", "release_all", "complete_task", "fail_task"}

    async def main() -> None:
        async with agent(shared, "mcp-schemas") as a:
            tools = {t.name: t for t in (await a.session.list_tools()).tools}
            assert set(tools) == TOOLS
            for name, tool in tools.items():
                hints = tool.annotations
                assert hints is not None and hints.title, name
                assert hints.read_only_hint is (name in read_only), name
                assert hints.destructive_hint is (name in destructive), name
                each_call_acts = name in (
                    "request_yield",
                    "take_task",
                    "spend_budget",
                    "reserve_budget",
                    "settle_budget",
                    "put_task",
                )
                assert hints.idempotent_hint is (not each_call_acts), name
                assert hints.open_world_hint is False, name
                inputs = tool.input_schema
                assert inputs["type"] == "object" and inputs["additionalProperties"] is False
                for arg, prop in inputs["properties"].items():
                    assert "description" in prop, (name, arg)
                outputs = tool.output_schema
                assert outputs is not None, name
                assert outputs["type"] == "object" and outputs["additionalProperties"] is False
                assert "lost_claims" in outputs["properties"], name
                assert len(outputs["properties"]) > 1, name
            # Bounds are the ones the server applies.
            claim = tools["claim"].input_schema["properties"]
            assert (claim["wait"]["minimum"], claim["wait"]["maximum"]) == (0, 3600)
            assert claim["key"]["maxLength"] == 4096 and claim["key"]["minLength"] == 1
            assert claim["units"]["minimum"] == 1 and claim["capacity"]["maximum"] == 10**6
            take_wait = tools["take_task"].input_schema["properties"]["wait"]["description"]
            assert "task" in take_wait and "key" not in take_wait, take_wait
            assert "fair queue" in claim["wait"]["description"]
            claim_out = tools["claim"].output_schema
            assert claim_out is not None
            assert set(claim_out["required"]) == {"key", "owner", "token", "valid_for", "units"}
            # Log messages are sent (lost claims), so the capability is declared.
            caps = a.session.server_capabilities
            assert caps is not None and caps.logging is not None

    run(main())


@pytest.mark.timeout(120)
def test_claiming_a_held_key_with_other_units_is_refused_definitely(shared: LocalCluster) -> None:
    """Issue 44: a claim of a key the session holds, with other units, answered
    `already_held: true` and the model believed it held what it asked for."""

    async def main() -> None:
        async with agent(shared, "mcp-units") as a:
            first = await a.call("claim", key="mcp/units", capacity=4, units=2, value="v1")
            same = await a.call("claim", key="mcp/units", capacity=4, units=2)
            assert same["already_held"] is True and same["token"] == first["token"]
            for other in (
                {"units": 3, "capacity": 4},
                {"units": 1, "capacity": 4},
                {"units": 2, "capacity": 8},
                {"units": 2, "capacity": 4, "value": "v2"},
            ):
                body = await a.refused("claim", {"key": "mcp/units", **other})
                assert "already holds 'mcp/units'" in body["message"], body
                assert "release" in body["message"], body
                if other["capacity"] == 4 and "value" not in other:
                    assert "2 of 4 units" in body["message"], body
            held = await a.call("who_holds", key="mcp/units")
            assert [(h["token"], h["units"]) for h in held["holders"]] == [(first["token"], 2)]
            # What the message says to do works: release, then claim with 3 units.
            await a.call("release", key="mcp/units")
            again = await a.call("claim", key="mcp/units", capacity=4, units=3)
            assert again["units"] == 3 and again["token"] > first["token"]

    run(main())


@pytest.mark.timeout(120)
def test_log_messages_follow_the_level_the_client_sets(shared: LocalCluster) -> None:
    """The logging capability is declared, so logging/setLevel is honoured: a client
    that asks for errors only gets no lost-claims warning (the result still says)."""

    async def main() -> None:
        async with agent(shared, "mcp-quiet") as a:
            with warnings.catch_warnings():  # deprecated by the newest revision only
                warnings.simplefilter("ignore")
                await a.session.set_logging_level("error")
            got = await a.call("claim", key="mcp/quiet")
            with shared.client() as c:
                c.revoke("mcp/quiet")
            listed = await a.call("list_claims")
            assert [lost["token"] for lost in listed["lost_claims"]] == [got["token"]]
            await a.call("who_holds", key="mcp/quiet")  # one more round trip
            assert a.logs == []

    run(main())


AGENT_TOKEN = "mcp-agent-token-0123456789abcdef"


@pytest.mark.timeout(180)
def test_credentials_and_permissions_apply(
    cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    bundle = secure_bundle(tmp_path / "tls")
    bundle.add_agents({"mcp-agent": AGENT_TOKEN})
    cluster = cluster_factory(3, **bundle.node_settings())
    tls = {"RAFTLEASE_CA_FILE": str(bundle.ca_file)}

    async def main() -> None:
        async with agent(cluster, "mcp-secure", RAFTLEASE_AUTH_TOKEN=AGENT_TOKEN, **tls) as a:
            got = await a.call("claim", key="gpu/0")
            assert got["token"] > 0
            with pytest.raises(ToolFailed) as err:
                await a.call("claim", key="ops/y")
            assert err.value.code == "PERMISSION_DENIED" and err.value.body["definite"]
            with pytest.raises(ToolFailed) as err:
                await a.call("who_holds", key="ops/y")
            assert err.value.code == "PERMISSION_DENIED"
            assert (await a.call("who_holds", key="gpu/0"))["holders"][0]["mine"] is True
            with pytest.raises(ToolFailed) as err:
                await a.call("audit", key="gpu/0")  # the trail is for admins only
            assert err.value.code == "PERMISSION_DENIED"
        async with agent(cluster, "mcp-anonymous", RAFTLEASE_AUTH_TOKEN="", **tls) as a:
            with pytest.raises(ToolFailed) as err:
                await a.call("claim", key="gpu/1")
            assert err.value.code == "UNAUTHENTICATED"

    run(main())
    from raftlease import Client

    with Client(cluster.endpoints, tls=str(bundle.ca_file), token=bundle.admin_token) as admin:
        assert admin.holder("ops/y") is None and admin.holder("gpu/1") is None
        assert admin.holder("gpu/0") is None  # released when the MCP session ended


def test_errors_never_show_the_model_a_lease_session_or_lease_id() -> None:
    """The cluster's messages name the agent's own lease session in places (a full
    session, SESSION_NOT_FOUND, a claim that is not yours): that id would let anyone
    who reads the transcript keep the agent's claims alive after it died, or close
    them. A tool error shows neither it nor a lease id, in the message or the detail."""
    from raftlease.errors import InvalidArgumentError, LeaseHeldError
    from raftlease.mcp_server import _from_raftlease

    sid, lid = "a1a4af7aac4533633ca36ddeadf13dad", "0123456789abcdef0123456789abcdef"
    full = InvalidArgumentError(f"lease session '{sid}' already carries 10000 leases")
    held = LeaseHeldError(f"'k' is held (lease {lid})", {"owner": "b", "lease_id": lid, "sid": sid})
    for exc in (full, held):
        text = str(_from_raftlease(exc))
        assert sid not in text and lid not in text, text
        assert json.loads(text)["code"] == exc.code
    assert json.loads(str(_from_raftlease(held)))["detail"] == {"owner": "b"}


@pytest.mark.timeout(120)
def test_claim_many_takes_a_set_whole_and_request_yield_reaches_a_claim(
    shared: LocalCluster,
) -> None:
    """Issue 40: claim_many takes every key or none (LEASE_HELD naming the busy ones),
    the set's keys are claims of the session (kept alive, released one by one); a
    request_yield from another agent reaches the holder's next renew answer."""

    async def main() -> None:
        async with agent(shared, "mcp-many") as a, agent(shared, "mcp-boss") as boss:
            got = await a.call("claim_many", keys=["mcp/many/a", "mcp/many/b"])
            assert [c["key"] for c in got["claims"]] == ["mcp/many/a", "mcp/many/b"]
            assert all(c["owner"] == "mcp-many" and c["token"] > 0 for c in got["claims"])
            with pytest.raises(ToolFailed) as busy:
                await boss.call("claim_many", keys=["mcp/many/b", "mcp/many/c"])
            assert busy.value.code == "LEASE_HELD"
            assert busy.value.body["detail"]["keys"] == ["mcp/many/b"]
            asked = await boss.call("request_yield", key="mcp/many/a", deadline=60.0, priority=1)
            assert asked == {"key": "mcp/many/a", "asked": 1}
            mine = await a.call("list_claims")
            assert sorted(c["key"] for c in mine["claims"]) == ["mcp/many/a", "mcp/many/b"]
            await a.call("release", key="mcp/many/a")
            await a.call("release", key="mcp/many/b")
            again = await boss.call("claim_many", keys=["mcp/many/b", "mcp/many/c"], wait=5.0)
            assert len(again["claims"]) == 2

    run(main())


@pytest.mark.timeout(120)
def test_a_yield_request_shows_in_the_holders_renew(shared: LocalCluster) -> None:
    async def main() -> None:
        async with agent(shared, "mcp-holder") as a:
            held = await a.call("claim", key="mcp/yield/k")
            with shared.client() as c:
                assert c.request_yield("mcp/yield/k", deadline=60.0, priority=1) == 1

            async def told() -> dict[str, Any]:
                for _ in range(100):
                    body = await a.call("renew", key="mcp/yield/k")
                    if body.get("yield_requested"):
                        return body
                    await asyncio.sleep(0.1)
                raise AssertionError("no yield_requested in renew")

            body = await told()
            request = body["yield_requested"][0]
            assert request["key"] == "mcp/yield/k" and request["token"] == held["token"]
            assert 0 < request["seconds_left"] <= 60.0

    run(main())
