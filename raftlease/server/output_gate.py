"""Output backpressure for one client connection (issue 37).

Before it, every answer was written into the transport's buffer whatever the peer
did: an authorised reader that sent 200 ``leases(limit=10000)`` and never read the
answers grew a follower from 65 to 1,449 MiB, and the answers' construction stalled
other clients' reads for 7-8 s. Now, per connection:

* the transport's high-water mark is ``max_conn_output``: once that many bytes of
  answers are unsent, the connection is not read any more, and no request already
  read starts being answered (``room``), until the peer has read its output down to
  a quarter of it (asyncio's low-water mark);
* answers that may be large (the operations with a ``limit``: lists) are built one at
  a time (``bulk``), each only when there is room: many of them requested at once
  cannot all be built before the first is written;
* output over the bound of which the peer reads nothing for
  ``OUTPUT_STALL_TIMEOUT`` closes the connection (``max_conn_output`` in the
  connections-closed metric).

A node's memory for one connection is then about ``max_conn_output`` plus one list
answer plus its small answers in flight (``MAX_INFLIGHT_PER_CONNECTION``), and
other connections are served meanwhile.

Threads: the event loop's only. ``room`` waits; nothing else blocks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..operations import ops_reading

log = logging.getLogger("raftlease.server")

#: Seconds a connection's unsent output may stay over ``max_conn_output`` with none of
#: it read before the connection is closed (the same patience as a watch's write, watch.py).
OUTPUT_STALL_TIMEOUT = 30.0

#: Operations whose answer grows with a ``limit`` (lists): built one at a time.
BULK_OPS = ops_reading("limit")


class OutputGate:
    """The output bound of one connection (module docstring). ``close(limit,
    reason)`` closes the connection (ClientPort.serve's)."""

    def __init__(
        self,
        writer: asyncio.StreamWriter,
        bound: int,
        close: Callable[[str, str], None],
        stall_timeout: float = OUTPUT_STALL_TIMEOUT,
    ) -> None:
        self._writer = writer
        self._bound = bound
        self._close = close
        self._stall_timeout = stall_timeout
        #: Held while a list answer is built and written (one at a time).
        self.bulk = asyncio.Lock()
        # Asyncio pauses the stream's writer above ``high`` and resumes it below
        # ``high // 4``: ``drain`` then waits for exactly our bound.
        writer.transport.set_write_buffer_limits(high=bound)

    def unsent(self) -> int:
        """Bytes written to the connection and not yet sent."""
        return self._writer.transport.get_write_buffer_size()

    async def room(self) -> None:
        """Return at once while the unsent output is within the bound; otherwise wait
        until the peer has read it down to a quarter. Raises ``ConnectionResetError``
        when the connection is closed meanwhile, or closes it (and raises) when the
        peer reads nothing of it for the stall timeout (a slow reader that keeps
        reading is waited for)."""
        unsent = self.unsent()
        while unsent > self._bound:
            try:
                await asyncio.wait_for(self._writer.drain(), self._stall_timeout)
                return
            except TimeoutError:
                before, unsent = unsent, self.unsent()
                if unsent < before:
                    continue  # it reads, slowly
                self._close(
                    "max_conn_output",
                    f"{unsent} bytes of answers unread for {self._stall_timeout:g} s "
                    f"(max_conn_output is {self._bound})",
                )
                raise ConnectionResetError("output stalled") from None
