"""Python clients (ARCHITECTURE §1: a client process needs only this package, the
ground modules and msgpack; never pysyncobj or the server).

* ``aio``: ``AsyncClient`` (asyncio);
* ``blocking``: ``Client`` (blocking, thread-safe; an ``AsyncClient`` on a private
  event-loop thread);
* ``budgets``: the shared budgets' value types and the spend with a wait;
* ``transport``: finding the leader, redirects, retries until the deadline;
* ``connection``: one pipelined TCP connection, and the client id and sequence
  numbers that make retries idempotent.
"""

from ..models import RW_CAPACITY, Attachable, Holder, Lease, Read, WatchEvent
from .aio import DEFAULT_CLOCK_DRIFT, DEFAULT_MARGIN, AsyncClient
from .aio_queue import AsyncQueue, AsyncTask, AttemptRecord, QueueStats, TaskInfo
from .blocking import Client
from .budgets import BudgetInfo, Reservation, Settlement, Spend
from .queue import Queue, Task
from .transport import DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_DEADLINE

__all__ = [
    "DEFAULT_ATTEMPT_TIMEOUT",
    "DEFAULT_CLOCK_DRIFT",
    "DEFAULT_DEADLINE",
    "DEFAULT_MARGIN",
    "RW_CAPACITY",
    "AsyncClient",
    "AsyncQueue",
    "AsyncTask",
    "Attachable",
    "AttemptRecord",
    "BudgetInfo",
    "Client",
    "Holder",
    "Lease",
    "Queue",
    "QueueStats",
    "Read",
    "Reservation",
    "Settlement",
    "Spend",
    "Task",
    "TaskInfo",
    "WatchEvent",
]
