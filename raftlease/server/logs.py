"""A node's log lines: key=value text (the default) or one JSON object a line.

``raftlease node`` (raftlease/cli/node.py) and the test build of a node
(``python -m raftlease.testing.node``) both call ``setup_logging``: how a node logs
belongs to the node, not to the command line that happens to start it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any

#: ``--log-format``: key=value text (the default) or one JSON object a line.
LOG_FORMATS = ("text", "json")
TEXT_LOG_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s pid=%(process)d %(message)s"


#: The node this process runs (``set_log_node``), named in every JSON line.
_node_id: str | None = None


def set_log_node(node_id: str) -> None:
    """Name the node in every JSON log line from now on (``run_node`` calls it once
    the config is loaded). Any thread."""
    global _node_id
    _node_id = node_id


def iso_utc(created: float) -> str:
    """A record's time as ISO 8601 in UTC with milliseconds: ``2026-12-06T17:53:15.123Z``
    (what log pipelines parse without a zone table)."""
    stamp = datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


class JsonLogFormatter(logging.Formatter):
    """One JSON object a line: ``time`` (ISO 8601, UTC, milliseconds), ``level``,
    ``logger``, ``node`` (once known), ``pid``, ``message``, and ``exc`` (the traceback)
    when there is one. The text format keeps its local time stamp for people reading a
    terminal; machines read JSON."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "time": iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
        }
        if _node_id is not None:
            fields["node"] = _node_id
        fields["pid"] = record.process
        fields["message"] = record.getMessage()
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        return json.dumps(fields, default=str)


def setup_logging(level: str, log_format: str | None = None) -> None:
    """Log lines on stderr (the node's and the test node's): key=value text, or JSON
    with the same fields. ``log_format`` None: ``$RAFTLEASE_LOG_FORMAT`` or text (so
    the nodes ``raftlease up`` starts inherit its choice). Configures the root logger
    once (``logging.basicConfig``); call it on the main thread before the node starts."""
    log_format = log_format or os.environ.get("RAFTLEASE_LOG_FORMAT") or "text"
    handler = logging.StreamHandler(sys.stderr)
    json_lines = log_format == "json"
    handler.setFormatter(JsonLogFormatter() if json_lines else logging.Formatter(TEXT_LOG_FORMAT))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
    # PySyncObj logs connection churn at WARNING; keep it unless asked for debug.
    if level.upper() != "DEBUG":
        logging.getLogger("pysyncobj").setLevel(logging.ERROR)


__all__ = [
    "LOG_FORMATS",
    "TEXT_LOG_FORMAT",
    "JsonLogFormatter",
    "iso_utc",
    "set_log_node",
    "setup_logging",
]
