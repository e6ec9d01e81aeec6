"""etcd and ZooKeeper measured beside raftlease in the same run (issue 16).

Modules:

- ``common``: server processes by pid, the load loop (one client object per
  thread), entries in raftlease's shape;
- ``etcd``: an etcd 3.4 cluster and its v3 HTTP/JSON gateway client;
- ``zookeeper``: a ZooKeeper 3.8 ensemble and a kazoo client;
- ``run``: the anchors phase of ``scripts/bench`` (detection, skips, workloads);
- ``table``: the comparison table and the issue 16 target checks, from a saved
  result (imports neither raftlease nor the measuring modules, like ``report``).

Importing this package imports nothing else (``scripts/bench`` reads ``ANCHORS``
before the frozen copy of raftlease exists).
"""

#: Anchor names, in run order (``scripts/bench --anchors``).
ANCHORS = ("etcd", "zookeeper")


def wanted_anchors(spec: str, quick: bool) -> list[str]:
    """The anchors ``--anchors`` asks for: "none", "auto" (every one; what an empty
    or "default" value means for the full profile, while --quick means "none") or a
    comma list of names. ValueError on an unknown name."""
    spec = spec.strip()
    if spec in ("", "default"):
        spec = "none" if quick else "auto"
    if spec == "none":
        return []
    if spec == "auto":
        return list(ANCHORS)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    bad = sorted(set(names) - set(ANCHORS))
    if bad:
        raise ValueError(f"unknown anchor(s): {', '.join(bad)} (of {', '.join(ANCHORS)})")
    return list(dict.fromkeys(names))
