"""``python -m raftlease.cli``, as the former cli.py allowed (``python -m raftlease`` is
the usual spelling)."""

from .root import main

main()
