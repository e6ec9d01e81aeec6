"""Python clients (ARCHITECTURE §1: a client process needs only this package, the
ground modules and msgpack; never pysyncobj or the server).

* ``aio``: ``AsyncClient`` (asyncio);
* ``blocking``: ``Client`` (blocking, thread-safe; an ``AsyncClient`` on a private
  event-loop thread);
* ``transport``: finding the leader, redirects, retries until the deadline;
* ``connection``: one pipelined TCP connection, and the client id and sequence
  numbers that make retries idempotent.
"""

from ..models import RW_CAPACITY, Attachable, Holder, Lease, Read, WatchEvent
from .aio import DEFAULT_CLOCK_DRIFT, DEFAULT_MARGIN, AsyncClient
from .aio_queue import AsyncQueue, AsyncTask, AttemptRecord, QueueStats, TaskInfo
from .blocking import Client
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
    "Client",
    "Holder",
    "Lease",
    "Queue",
    "QueueStats",
    "Read",
    "Task",
    "TaskInfo",
    "WatchEvent",
]
