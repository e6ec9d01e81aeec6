"""``GroupSendSyncObj`` (replication/group_send.py): the commands one tick appends go
to each follower in one ``append_entries``, not one message per command; the commit
index is not broadcast on its own; and every entry still arrives, in order, on every
node.

Three PySyncObj objects on 127.0.0.1 with ``autoTick=False``: the test runs every
tick itself, so "one tick" is exact and nothing depends on timing. The same run with
PySyncObj's own ``SyncObj`` shows what the grouping removes (and that the counting
would see a regression).

The unit half of these tests (no process); the integration half is
tests/integration/test_group_send.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf, SyncObjConsumer, replicated

from raftlease.replication.group_send import GroupSendSyncObj
from raftlease.testing import free_port_block

pytestmark = pytest.mark.timeout(60)


class Log(SyncObjConsumer):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.items: list[int] = []

    @replicated  # type: ignore[misc]
    def add(self, item: int) -> None:
        self.items.append(item)


def test_the_batch_flag_is_restored_when_the_tick_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    addr = f"127.0.0.1:{free_port_block(1)}"
    conf = SyncObjConf(autoTick=False, appendEntriesUseBatch=False, bindAddress=addr)
    node = GroupSendSyncObj(addr, [], conf, consumers=[Log()])

    def boom(self: Any) -> None:
        assert self._SyncObj__conf.appendEntriesUseBatch is True  # set while it runs
        raise RuntimeError("boom")

    monkeypatch.setattr(SyncObj, "_checkCommandsToApply", boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            node._checkCommandsToApply()
        assert node._SyncObj__conf.appendEntriesUseBatch is False
    finally:
        node.destroy()
