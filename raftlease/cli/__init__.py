"""The ``raftlease`` command (``python -m raftlease``): ``root.main`` is the click group
that registers every command; ``common`` holds what the commands share. Arrows go one
way: root -> the command modules -> common (docs/cli.md, docs/architecture.md)."""

from .root import main

__all__ = ["main"]
