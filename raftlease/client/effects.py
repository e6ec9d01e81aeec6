"""The effect journal on the clients (issue 41; docs/queues.md, "Effects"):
``task.effect(effect_id)`` records the intent of an external call in the log before
the call, and ``effect.commit(result)`` its result after, so a later attempt of the
task skips an effect already made and reconciles one that may have been made.

    with task.effect("charge:order-17", idempotency_key="order-17",
                     reconcile=lambda token, key: provider.lookup(key)) as e:
        if not e.done:                      # new, or an earlier attempt's call left no trace
            receipt = provider.charge(17, idempotency_key=e.key, fencing_token=task.token)
            e.commit(receipt)               # StaleAttemptError if no longer current
        receipt = e.result

``AsyncEffect`` (``async with task.effect(...)``, ``AsyncTask.effect``) and ``Effect``
(the blocking twin, ``Task.effect``). Entering the block begins the effect (one
replicated write); leaving it does nothing: an effect begun and never committed stays
``in_progress`` for the next attempt to reconcile.

The same classes serve plain leases (docs/usage.md, "Effects under a lease"):
``client.effect(lease, "charge:order-17", ...)`` (``AsyncClient.effect``,
``Client.effect``) journals the effect under the lease's KEY, fenced by its token, for
the key's next holders (``LeaseEffectOwner``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..errors import InvalidArgumentError, RaftLeaseError, StaleAttemptError, TaskNotFoundError
from ..models import BlockingPortal
from .caller import Caller


def _encode(value: Any) -> str:
    """JSON text of a result (as ``aio_queue.encode_json``, which imports this module)."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"an effect's result must be a JSON value: {exc}") from None


def _decode(text: Any) -> Any:
    if not isinstance(text, str) or not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text  # written by another tool: returned as it is


#: A reconcile hook: called with the earlier attempt's token and the idempotency key
#: when an earlier attempt began the effect and did not commit it. It returns the
#: effect's result if the provider shows the effect was made (it is then committed
#: with it), or None if it was not (make the call). The async client also takes a
#: coroutine function.
Reconcile = Callable[[int, str], Any]


class EffectTask(Protocol):
    """What an effect needs of its owner (``AsyncTask``, ``LeaseEffectOwner``):
    ``_effect_call("begin" | "commit", args, timeout)`` sends the owner's operation
    (``args``: ``effect``, and ``key`` (the idempotency key) or ``result``)."""

    async def _effect_call(
        self, op: str, args: dict[str, Any], timeout: float | None
    ) -> dict[str, Any]: ...


class LeaseEffectOwner:
    """The effects of one held lease: ``lease_effect_begin`` / ``lease_effect_commit``
    with the lease's key and lease id (its proof), so the journal is the key's and
    the cluster refuses a lease that is no longer the key's live one
    (``LeaseNotFoundError`` or ``NotOwnerError``, definite)."""

    def __init__(self, client: Caller, key: str, lease_id: str) -> None:
        self._client = client
        self._key = key
        self._lease_id = lease_id

    async def _effect_call(
        self, op: str, args: dict[str, Any], timeout: float | None
    ) -> dict[str, Any]:
        wire: dict[str, Any] = {"key": self._key, "lease_id": self._lease_id}
        wire["effect"] = args["effect"]
        if "key" in args:  # the idempotency key: ``key`` names the lease's key here
            wire["idempotency_key"] = args["key"]
        if "result" in args:
            wire["result"] = args["result"]
        return await self._client.call(f"lease_effect_{op}", wire, mutating=True, timeout=timeout)


class AsyncEffect:
    """One effect of one attempt. After entering: ``state`` is ``new`` (the intent is
    recorded: make the call, then ``commit``), ``committed`` (an attempt made it:
    ``result`` is its result, skip the call) or ``in_progress`` (an earlier attempt
    began it and did not commit: ``prior_token`` and ``key`` say which; the reconcile
    hook, if given, has decided). ``done``: committed (by now or before). ``key``: the
    idempotency key to hand the provider (the first intent's, the same for every
    attempt). Raises ``StaleAttemptError`` when the attempt is no longer current
    (nothing recorded), ``QuotaExceededError`` when the task already records 32
    effects. Under a lease (``LeaseEffectOwner``) "attempt" reads "holder of the
    key": a lease no longer the key's live one raises ``LeaseNotFoundError`` or
    ``NotOwnerError`` instead, and the quota is 32 effects per key (20,000 in all);
    ``prior_attempt`` stays None. The calls run on the client's event loop;
    cancelling one leaves its outcome unknown (a retry is deduplicated)."""

    def __init__(
        self,
        task: EffectTask,
        effect_id: str,
        *,
        idempotency_key: str | None = None,
        reconcile: Reconcile | None = None,
        timeout: float | None = None,
    ) -> None:
        if not isinstance(effect_id, str) or not effect_id:
            raise InvalidArgumentError("an effect needs a non-empty string id")
        self._task = task
        self.effect_id = effect_id
        self._key = idempotency_key
        self._reconcile = reconcile
        self._timeout = timeout
        self.state: str | None = None
        self.key: str = idempotency_key or ""
        self.token: int | None = None
        self.result: Any = None
        self.prior_token: int | None = None
        self.prior_attempt: int | None = None
        #: True once the reconcile hook found the effect made (and it was committed).
        self.reconciled = False
        #: After ``commit``: True when it had been committed before (``result`` is
        #: that first commit's).
        self.already = False

    @property
    def done(self) -> bool:
        """Whether the effect is committed: skip the call, ``result`` is its result."""
        return self.state == "committed"

    async def _begin(self) -> None:
        args: dict[str, Any] = {"effect": self.effect_id}
        if self._key:
            args["key"] = self._key
        answer = await self._task._effect_call("begin", args, self._timeout)
        self.state = str(answer["state"])
        self.key = str(answer.get("key", ""))
        self.token = answer.get("token")
        self.prior_token = answer.get("prior_token")
        self.prior_attempt = answer.get("prior_attempt")
        if self.state == "committed":
            self.result = _decode(answer.get("result"))

    async def commit(self, result: Any = None, *, timeout: float | None = None) -> None:
        """Record that the effect was made, with ``result`` (a JSON value of at most
        1 KiB of JSON text; a later attempt reads it instead of calling again). Raises
        ``StaleAttemptError`` (a lease: ``LeaseNotFoundError``, ``NotOwnerError``)
        when this attempt (lease) is no longer current: the commit is refused
        (definite), and the effect stays in progress for the current holder to
        reconcile."""
        args = {"effect": self.effect_id, "result": _encode(result)}
        answer = await self._task._effect_call(
            "commit", args, self._timeout if timeout is None else timeout
        )
        self.state = "committed"
        self.result = _decode(answer.get("result"))
        # The committing token, and whether another commit came first (its result kept).
        self.token = answer.get("token", self.token)
        self.already = bool(answer.get("already"))

    async def __aenter__(self) -> AsyncEffect:
        await self._begin()
        if self.state == "in_progress" and self._reconcile is not None:
            found = self._reconcile(int(self.prior_token or 0), self.key)
            if inspect.isawaitable(found):
                found = await found
            if found is not None:
                await self.commit(found)
                self.reconciled = True
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        return None


class Effect:
    """The blocking twin of ``AsyncEffect`` (``Task.effect``): the same fields; the
    reconcile hook runs in the calling thread (never on the client's loop, where it
    would hold up heartbeats). Calls block up to their deadline."""

    def __init__(self, portal: BlockingPortal, aio: AsyncEffect) -> None:
        self._portal = portal
        self.aio = aio

    @property
    def state(self) -> str | None:
        return self.aio.state

    @property
    def key(self) -> str:
        return self.aio.key

    @property
    def token(self) -> int | None:
        return self.aio.token

    @property
    def result(self) -> Any:
        return self.aio.result

    @property
    def prior_token(self) -> int | None:
        return self.aio.prior_token

    @property
    def prior_attempt(self) -> int | None:
        return self.aio.prior_attempt

    @property
    def reconciled(self) -> bool:
        return self.aio.reconciled

    @property
    def already(self) -> bool:
        return self.aio.already

    @property
    def done(self) -> bool:
        return self.aio.done

    def commit(self, result: Any = None, *, timeout: float | None = None) -> None:
        """As ``AsyncEffect.commit`` (raises ``StaleAttemptError``)."""
        self._portal.run(self.aio.commit(result, timeout=timeout))

    def __enter__(self) -> Effect:
        self._portal.run(self.aio._begin())
        hook = self.aio._reconcile
        if self.aio.state == "in_progress" and hook is not None:
            found = hook(int(self.aio.prior_token or 0), self.aio.key)
            if found is not None:
                self.commit(found)
                self.aio.reconciled = True
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        return None


async def effect_call(
    call: Callable[[], Awaitable[dict[str, Any]]], gone: Callable[[RaftLeaseError], None]
) -> dict[str, Any]:
    """Run an effect call; a refusal of the attempt marks the task lost (``gone``)."""
    try:
        return await call()
    except (StaleAttemptError, TaskNotFoundError) as exc:
        gone(exc)
        raise
