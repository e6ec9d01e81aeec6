"""The keep-alive batcher's rules (client/keepalive_batch.py) against a scripted
``call``: what is gathered into one request, what waits for the next, timeouts,
cancellation, errors, and a node of an earlier build that does not know the
operation. On real nodes: tests/integration/test_keepalive_batch.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftlease.client import keepalive_batch
from raftlease.client.keepalive_batch import MAX_IN_FLIGHT, KeepaliveBatcher
from raftlease.errors import (
    BadRequestError,
    SessionNotFoundError,
    TimeoutError_,
    UnavailableError,
)
from raftlease.limits import MAX_KEEPALIVE_SESSIONS

pytestmark = pytest.mark.timeout(30)


class Scripted:
    """A ``call`` that records each request and answers when the test says so."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any], float | None]] = []
        self.gates: list[asyncio.Future[None]] = []
        self.hold = False
        self.refuse: BaseException | None = None
        self.single_for: set[str] = set()
        #: Answer as a cluster with ``keepalives = "log"``: every session single.
        self.log_mode = False
        #: Seconds each request takes (honouring its timeout, as the transport does).
        self.delay = 0.0

    async def __call__(self, op: str, args: dict[str, Any], timeout: float | None) -> Any:
        self.requests.append((op, args, timeout))
        if self.delay:
            if timeout is not None and timeout < self.delay:
                await asyncio.sleep(timeout)
                raise TimeoutError_("no answer in time")
            await asyncio.sleep(self.delay)
        if self.hold:
            gate = asyncio.get_running_loop().create_future()
            self.gates.append(gate)
            await gate
        if op == "session_keepalive":
            if args["session_id"] == "00":
                raise SessionNotFoundError("no such session")
            return {"session_id": args["session_id"], "via": "single"}
        if self.refuse is not None:
            raise self.refuse
        if self.log_mode:
            sessions = [{"session_id": sid, "single": True} for sid in args["session_ids"]]
            return {"sessions": sessions, "keepalives": "log"}
        return {
            "sessions": [
                {"session_id": sid, "single": True}
                if sid in self.single_for
                else {"session_id": sid, "ttl": 5000}
                for sid in args["session_ids"]
            ]
        }

    def batches(self) -> list[list[str]]:
        return [a["session_ids"] for op, a, _ in self.requests if op == "session_keepalive_many"]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_one_turns_keepalives_leave_in_one_request() -> None:
    async def main() -> None:
        call = Scripted()
        batcher = KeepaliveBatcher(call, 5.0)
        answers = await asyncio.gather(*(batcher.keepalive(f"a{i}", 1.0) for i in range(10)))
        assert call.batches() == [[f"a{i}" for i in range(10)]]
        assert [a["session_id"] for a in answers] == [f"a{i}" for i in range(10)]
        assert batcher.batches == 1 and batcher.batched == 10
        # A lone keep-alive on an idle batcher leaves at once, alone.
        assert (await batcher.keepalive("1e", None))["session_id"] == "1e"
        assert call.batches()[-1] == ["1e"]
        # The batch's deadline is its shortest caller's; None means the client's.
        assert call.requests[-1][2] == pytest.approx(5.0, abs=0.5)

    run(main())


def test_keepalives_asked_while_batches_fly_join_the_next_one() -> None:
    async def main() -> None:
        call = Scripted()
        call.hold = True
        batcher = KeepaliveBatcher(call, 5.0)
        first = []
        for i in range(MAX_IN_FLIGHT):
            # Asked in turns of their own: a batch each.
            first.append(asyncio.create_task(batcher.keepalive(f"a{i}", 2.0)))
            while len(call.gates) <= i:
                await asyncio.sleep(0.001)
        later = [asyncio.create_task(batcher.keepalive(f"b{i}", 2.0)) for i in range(5)]
        await asyncio.sleep(0.01)
        assert len(call.requests) == MAX_IN_FLIGHT  # none left while both fly
        call.gates[0].set_result(None)
        while len(call.gates) < MAX_IN_FLIGHT + 1:
            await asyncio.sleep(0.001)
        assert call.batches()[-1] == [f"b{i}" for i in range(5)]
        for gate in call.gates[1:]:
            gate.set_result(None)
        await asyncio.gather(*first, *later)

    run(main())


def test_a_batch_holds_at_most_the_limit_and_one_entry_per_session() -> None:
    async def main() -> None:
        call = Scripted()
        batcher = KeepaliveBatcher(call, 5.0)
        count = MAX_KEEPALIVE_SESSIONS + 10
        sids = [f"a{i}" for i in range(count)] + ["a0"]  # s0 asked twice
        answers = await asyncio.gather(*(batcher.keepalive(sid, 1.0) for sid in sids))
        sizes = [len(b) for b in call.batches()]
        assert max(sizes) == MAX_KEEPALIVE_SESSIONS and sum(sizes) == count
        assert all(len(set(b)) == len(b) for b in call.batches())
        assert answers[0]["session_id"] == answers[-1]["session_id"] == "a0"

    run(main())


def test_a_session_answered_single_gets_its_own_keepalive_and_its_error() -> None:
    async def main() -> None:
        call = Scripted()
        call.single_for = {"00", "10"}
        batcher = KeepaliveBatcher(call, 5.0)
        results = await asyncio.gather(
            batcher.keepalive("0c", 1.0),
            batcher.keepalive("10", 1.0),
            batcher.keepalive("00", 1.0),
            return_exceptions=True,
        )
        assert results[0] == {"session_id": "0c", "ttl": 5000}
        assert results[1] == {"session_id": "10", "via": "single"}
        assert isinstance(results[2], SessionNotFoundError)

    run(main())


def test_an_id_the_cluster_did_not_issue_is_sent_alone() -> None:
    async def main() -> None:
        call = Scripted()
        batcher = KeepaliveBatcher(call, 5.0)
        answers = await asyncio.gather(
            batcher.keepalive("ab", 1.0), batcher.keepalive("Not-Hex", 1.0)
        )
        assert call.batches() == [["ab"]]
        assert answers[1] == {"session_id": "Not-Hex", "via": "single"}

    run(main())


def test_a_batch_error_reaches_every_caller_and_an_earlier_build_turns_batching_off() -> None:
    async def main() -> None:
        call = Scripted()
        batcher = KeepaliveBatcher(call, 5.0)
        call.refuse = UnavailableError("no leader")
        results = await asyncio.gather(
            *(batcher.keepalive(f"a{i}", 1.0) for i in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, UnavailableError) for r in results)
        # Each caller its own instance (one raised in several tasks gathers tracebacks).
        assert len({id(r) for r in results}) == 3
        assert {str(r) for r in results} == {str(UnavailableError("no leader"))}
        assert batcher.enabled
        # Another BAD_REQUEST is an answer like any other, not a reason to stop.
        call.refuse = BadRequestError("field 'session_ids' must be a list")
        with pytest.raises(BadRequestError):
            await batcher.keepalive("a0", 1.0)
        assert batcher.enabled
        call.refuse = BadRequestError(
            "unknown operation 'session_keepalive_many'; expected one of [...]"
        )
        answers = await asyncio.gather(*(batcher.keepalive(f"a{i}", 1.0) for i in range(3)))
        assert [a["via"] for a in answers] == ["single"] * 3
        assert not batcher.enabled and batcher.pauses == 1

    run(main())


def test_a_pause_sends_keepalives_singly_and_then_batches_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An earlier build's refusal and a cluster keeping sessions alive through the log
    both pause batching for ``PAUSE`` seconds, with a warning; then it batches again."""
    monkeypatch.setattr(keepalive_batch, "PAUSE", 0.2)

    async def paused_then_batching(call: Scripted, batcher: KeepaliveBatcher) -> None:
        assert not batcher.enabled and batcher.pauses == 1
        batches = batcher.batches
        answers = await asyncio.gather(*(batcher.keepalive(f"b{i}", 1.0) for i in range(3)))
        assert [a["via"] for a in answers] == ["single"] * 3
        assert batcher.batches == batches  # no request of the batch kind while paused
        deadline = asyncio.get_running_loop().time() + 5.0
        while not batcher.enabled:
            assert asyncio.get_running_loop().time() < deadline, "the pause never ended"
            await asyncio.sleep(0.01)
        call.refuse, call.log_mode = None, False
        answers = await asyncio.gather(*(batcher.keepalive(f"c{i}", 1.0) for i in range(3)))
        assert answers == [{"session_id": f"c{i}", "ttl": 5000} for i in range(3)]
        assert batcher.batches == batches + 1

    async def main() -> None:
        with caplog.at_level("WARNING", logger=keepalive_batch.__name__):
            call = Scripted()
            batcher = KeepaliveBatcher(call, 5.0)
            call.refuse = BadRequestError("unknown operation 'session_keepalive_many'")
            assert (await batcher.keepalive("a1", 1.0))["via"] == "single"
            await paused_then_batching(call, batcher)
            # keepalives = "log": the batch comes back all single, and says why.
            call = Scripted()
            call.log_mode = True
            batcher = KeepaliveBatcher(call, 5.0)
            answers = await asyncio.gather(*(batcher.keepalive(f"a{i}", 1.0) for i in range(2)))
            assert [a["via"] for a in answers] == ["single"] * 2
            await paused_then_batching(call, batcher)
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 2, warnings
        assert "earlier build" in warnings[0] and 'keepalives = "log"' in warnings[1]

    run(main())


def test_a_caller_times_out_on_its_own_deadline_and_a_cancelled_one_leaves_the_rest() -> None:
    async def main() -> None:
        call = Scripted()
        call.hold = True
        batcher = KeepaliveBatcher(call, 5.0)
        short = asyncio.create_task(batcher.keepalive("5a", 0.05))
        cancelled = asyncio.create_task(batcher.keepalive("ca", 5.0))
        other = asyncio.create_task(batcher.keepalive("0e", 5.0))
        with pytest.raises(TimeoutError_):
            await short
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        call.gates[0].set_result(None)
        assert (await other)["session_id"] == "0e"
        # The batch's deadline was its latest caller's.
        assert call.requests[0][2] == pytest.approx(5.0, abs=0.5)

    run(main())


def test_a_short_timeout_does_not_cut_the_batch_of_a_longer_one() -> None:
    async def main() -> None:
        call = Scripted()
        call.delay = 0.2  # the request takes 0.2 s and honours its timeout
        batcher = KeepaliveBatcher(call, 5.0)
        results = await asyncio.gather(
            batcher.keepalive("5a", 0.05), batcher.keepalive("0e", 5.0), return_exceptions=True
        )
        assert isinstance(results[0], TimeoutError_)
        assert results[1] == {"session_id": "0e", "ttl": 5000}
        assert call.batches() == [["5a", "0e"]]

    run(main())


def test_a_batch_cancelled_under_its_callers_leaves_them_an_unknown_outcome() -> None:
    async def main() -> None:
        call = Scripted()
        call.hold = True
        batcher = KeepaliveBatcher(call, 5.0)
        callers = [asyncio.create_task(batcher.keepalive(sid, 5.0)) for sid in ("a1", "b2")]
        while not call.gates:
            await asyncio.sleep(0.001)
        for task in list(batcher._tasks):
            task.cancel()
        results = await asyncio.gather(*callers, return_exceptions=True)
        assert all(isinstance(r, TimeoutError_) for r in results), results

    run(main())


def test_a_batch_whose_callers_gave_up_leaves_its_place_on_the_wire() -> None:
    """Two batches held by a slow cluster past their callers' deadlines must not keep
    the next keep-alive waiting behind them until their requests end."""

    async def main() -> None:
        call = Scripted()
        call.hold = True
        batcher = KeepaliveBatcher(call, 5.0)

        async def sent(count: int) -> None:
            while len(call.gates) < count:
                await asyncio.sleep(0.001)

        slow = [asyncio.create_task(batcher.keepalive("a1", 0.05))]
        await sent(1)
        slow.append(asyncio.create_task(batcher.keepalive("a2", 0.05)))
        await sent(2)
        later = asyncio.create_task(batcher.keepalive("a3", 5.0))
        await asyncio.sleep(0)
        assert len(call.gates) == 2  # both places are held
        for task in slow:
            with pytest.raises(TimeoutError_):
                await task
        await asyncio.wait_for(sent(3), 2.0)  # sent before the slow ones landed
        for gate in call.gates:
            gate.set_result(None)
        assert (await later)["session_id"] == "a3"
        while batcher._tasks:
            await asyncio.sleep(0.001)
        assert batcher._in_flight == 0

    run(main())
