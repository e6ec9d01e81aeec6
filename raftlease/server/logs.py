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
from typing import Any

#: ``--log-format``: key=value text (the default) or one JSON object a line.
LOG_FORMATS = ("text", "json")
TEXT_LOG_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s pid=%(process)d %(message)s"


class JsonLogFormatter(logging.Formatter):
    """The text format's fields as one JSON object a line: ``time`` (the text line's
    leading time stamp), ``level``, ``logger``, ``pid``, ``message``, and ``exc`` (the
    traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
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


__all__ = ["LOG_FORMATS", "TEXT_LOG_FORMAT", "JsonLogFormatter", "setup_logging"]
