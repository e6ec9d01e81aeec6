"""The blocking and the asyncio clients offer the same calls: every public method of
an asyncio class has a blocking counterpart with the same parameters (names, kinds,
defaults), so a user moving between them, and the docs that describe one for both,
are never wrong. The few calls that only make sense on an event loop are listed, with
why."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from raftlease.client.aio import AsyncClient
from raftlease.client.aio_queue import AsyncQueue, AsyncTask
from raftlease.client.blocking import Client
from raftlease.client.effects import AsyncEffect, Effect
from raftlease.client.queue import Queue, Task
from raftlease.recipes.election import AsyncElection, Election
from raftlease.recipes.keepalive import KeepAliveState
from raftlease.recipes.locks import AsyncHeldLock, HeldLock
from raftlease.recipes.sessions import AsyncSession, Session

pytestmark = pytest.mark.timeout(30)

PAIRS: list[tuple[type[Any], type[Any]]] = [
    (AsyncClient, Client),
    (AsyncQueue, Queue),
    (AsyncTask, Task),
    (AsyncEffect, Effect),
    (AsyncSession, Session),
    (AsyncElection, Election),
    (AsyncHeldLock, HeldLock),
]

#: Asyncio-only calls, and why a blocking client has no use for them.
ASYNC_ONLY = {
    # A coroutine to run on the client's loop when it closes (sessions stop their
    # keep-alives this way); the blocking client closes its loop itself.
    ("AsyncClient", "on_close"),
    # The arithmetic recipes use on the asyncio client they drive; the blocking
    # client hands out Lease values whose valid_until is already computed.
    ("AsyncClient", "valid_until"),
}


#: The renewal machinery the asyncio recipes inherit (``recipes/keepalive.py``):
#: called by the recipes themselves, not by users; the blocking twins delegate to it.
MACHINERY = set(vars(KeepAliveState))


def public_methods(cls: type[Any]) -> dict[str, Any]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_")
        and callable(member)
        and not inspect.isclass(member)
        and not (issubclass(cls, KeepAliveState) and name in MACHINERY)
    }


def parameters(function: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize(("aio", "blocking"), PAIRS, ids=lambda c: c.__name__)
def test_every_async_call_has_a_blocking_twin_with_the_same_parameters(
    aio: type[Any], blocking: type[Any]
) -> None:
    async_calls = public_methods(aio)
    blocking_calls = public_methods(blocking)
    missing = sorted(
        name
        for name in async_calls
        if name not in blocking_calls and (aio.__name__, name) not in ASYNC_ONLY
    )
    assert not missing, f"{blocking.__name__} lacks {missing} of {aio.__name__}"
    differ = {
        name: (str(inspect.signature(async_calls[name])), str(inspect.signature(call)))
        for name, call in blocking_calls.items()
        if name in async_calls and parameters(async_calls[name]) != parameters(call)
    }
    assert not differ, f"{blocking.__name__} and {aio.__name__} differ: {differ}"


def test_the_check_sees_a_difference() -> None:
    class Aio:
        async def put(self, payload: Any, *, priority: int = 0) -> None: ...

        async def extra(self) -> None: ...

    class Blocking:
        def put(self, payload: Any, **options: Any) -> None: ...

    assert parameters(Aio.put) != parameters(Blocking.put)
    assert set(public_methods(Aio)) - set(public_methods(Blocking)) == {"extra"}
