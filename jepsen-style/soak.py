"""The soak profile's resource monitor and its verdicts (``run.py --profile soak``).

``Monitor`` samples, every ``interval`` seconds (10 by default) while the soak runs,
each node process's resident memory (``VmRSS`` of ``/proc/PID/status``), its open
file descriptors (entries of ``/proc/PID/fd``; ``fds`` leaves out the established
connections accepted on a port the node listens on, counted apart as ``conns_in``,
see ``process_stats``), its threads (``Threads``), its age,
and the sizes of its data directory's files: ``raft.journal`` (the file, and the
bytes it uses: PySyncObj's journal is an mmap that only grows, its header holds the
end of the last record) and ``raft.dump`` (the snapshot). ``verdict`` judges the
series (pure functions, unit-tested on synthetic series in tests/chaos/test_soak_profile.py):

* **rss**: per node, the median over the *reference window* against the median over
  the last minute must grow by less than ``RSS_GROWTH`` (10 %). The reference window
  is the first minute after minute ``WARMUP_MINUTES`` (5), or, in a run shorter than
  ``WARMUP_MINUTES`` + 1 minutes, the first minute (then the rule compares the first
  minute with the last, warm-up included: ``windows`` says so in its note);
* **fds**, **threads**: the same medians may grow by at most ``COUNT_JITTER`` (5);
* **journal** (bytes in use), **dump**: bounded by compaction. The samples from the
  start of the reference window on are cut in two halves of equal time, and the
  median of the second half's peaks (sizes just before a shrink: each compaction's
  high-water mark; the half's maximum if it never shrank) must be at most
  ``SIZE_FACTOR`` x the median of the first half's plus ``SIZE_SLACK`` (a sawtooth
  keeps its peaks, growth raises them; one late compaction does not), and the size
  must never grow, by more than ``SIZE_SLACK``, over a stretch of ``NO_SHRINK_SPAN``
  seconds or more without shrinking once (the soak compacts every
  ``COMPACTION_MIN_ENTRIES`` entries: under its load, every half minute or so).

The soak's nodes run with ``compaction_min_entries = COMPACTION_MIN_ENTRIES`` (2,000
instead of 50,000): PySyncObj also compacts every ``compaction_min_time`` (30 s), but
counts that time from the process start, and the soak's kill and power-loss faults
restart a node about once a minute, often sooner; a node restarted more often than
every 30 s then compacts only at 50,000 entries (about 10 MB of journal, and about
twice that of memory, at this load), and where a one-minute window falls on that
sawtooth would decide the 10 % memory rule, not a leak.

Nodes are killed and restarted by the kill and power-loss faults, so a node's series
spans several processes: the memory, fd and thread medians skip samples of a process
younger than ``MIN_AGE`` seconds (still starting), and the rules compare the node's
footprint, not one process's; ``verdict`` reports each node's restarts and its
longest-lived process. A window without ``MIN_SAMPLES`` usable samples is widened
(by at most ``WIDEN`` seconds, away from the other window); a rule that still lacks
them is ``unknown``, never a pass.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import statistics
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from raftlease.testing.net import ESTABLISHED, LISTEN, tcp_sockets

#: Seconds between samples.
SAMPLE_EVERY = 10.0
#: Minutes of warm-up the RSS rule leaves out (when the run is long enough).
WARMUP_MINUTES = 5.0
#: Length of each compared window, seconds.
WINDOW = 60.0
#: How far a window short of samples may be widened, seconds.
WIDEN = 60.0
#: Fewest usable samples a window needs.
MIN_SAMPLES = 2
#: Largest allowed RSS growth (fraction) between the reference window and the last.
RSS_GROWTH = 0.10
#: Largest allowed growth of the fd and thread counts.
COUNT_JITTER = 5
#: Samples of a process younger than this (seconds) are not in the memory medians.
MIN_AGE = 20.0
#: Bounded sizes: second-half max <= SIZE_FACTOR * first-half max + SIZE_SLACK.
SIZE_FACTOR = 1.5
SIZE_SLACK = 64 * 1024
#: Growth without one shrink over at least this many seconds is unbounded growth.
NO_SHRINK_SPAN = 300.0
#: The soak's nodes compact their log every this many entries (see above).
COMPACTION_MIN_ENTRIES = 2_000
#: The soak's queue janitor purges a finished task this many seconds after its put was
#: answered (queue_workload.Janitor). Without it, completed tasks stay for their
#: retention (an hour by default) and dead letters until purged: the replicated state,
#: and with it every node's memory and dump, grows all run (measured: ~1 KB a task,
#: +13 to +42 % RSS over 30 minutes, the dump rule failing), which these rules cannot
#: tell from a leak. With it the state levels off in a few minutes, so the rules judge
#: the node process, not the workload's backlog.
PURGE_AFTER = 60.0
#: Where PySyncObj's journal header keeps the end of its last record
#: (``replay.END_OFFSET_AT``: name 24 bytes, version 8, format 4).
JOURNAL_END_AT = 36

Sample = dict[str, Any]
COUNTS = ("fds", "threads")
#: The columns of ``series``.
SERIES_FIELDS = (
    "t",
    "pid",
    "running",
    "age",
    "rss_kb",
    "fds",
    "conns_in",
    "threads",
    "journal_bytes",
    "journal_used",
    "dump_bytes",
)

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# ------------------------------------------------------------------ sampling


def process_stats(pid: int) -> dict[str, Any] | None:
    """RSS (KiB), threads, open fds and age (seconds) of process ``pid``, from /proc;
    None if it is gone.

    ``fds_total`` is every open fd; ``conns_in`` the established TCP connections the
    process accepted (local port one it listens on); ``fds`` the rest, which the
    rules judge. Accepted connections are left out because they follow the clients,
    not the node: each harness client keeps one connection to every node it was
    redirected to, so a node's count rises by about one per client the first time
    it leads (+13 on a 3-node soak with no restart) and stays. A node that leaks a
    socket still shows: one its client closed is in CLOSE_WAIT, not established."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        entries = os.listdir(f"/proc/{pid}/fd")
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return None
    conns_in = accepted_connections(pid, entries)
    out: dict[str, Any] = {
        "fds": len(entries) - conns_in,
        "fds_total": len(entries),
        "conns_in": conns_in,
    }
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == "VmRSS":
            out["rss_kb"] = int(value.split()[0])
        elif name == "Threads":
            out["threads"] = int(value.split()[0])
    # Field 22 of /proc/PID/stat (after the parenthesized command): start time in ticks.
    fields = stat.rpartition(")")[2].split()
    with contextlib.suppress(IndexError, ValueError):
        out["age"] = round(uptime - int(fields[19]) / _CLOCK_TICKS, 1)
    return out if "rss_kb" in out and "threads" in out else None


def accepted_connections(pid: int, entries: Iterable[str]) -> int:
    """How many of process ``pid``'s fds (``entries`` of /proc/PID/fd) are established
    TCP connections on a local port it also listens on (connections it accepted);
    0 when /proc cannot tell (the process gone meanwhile)."""
    inodes: set[str] = set()
    for name in entries:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ours = [sock for sock in tcp_sockets(pid, ("tcp", "tcp6")) if sock.inode in inodes]
    listening = {sock.local_port for sock in ours if sock.state == LISTEN}
    return sum(1 for sock in ours if sock.state == ESTABLISHED and sock.local_port in listening)


def file_sizes(directory: Path) -> dict[str, int | None]:
    """Sizes of a node's journal (file, and bytes in use) and dump; None if absent."""
    journal, dump = directory / "raft.journal", directory / "raft.dump"
    out: dict[str, int | None] = {"journal_bytes": None, "journal_used": None, "dump_bytes": None}
    with contextlib.suppress(OSError):
        out["journal_bytes"] = journal.stat().st_size
        with journal.open("rb") as f:
            f.seek(JOURNAL_END_AT)
            raw = f.read(4)
        if len(raw) == 4:
            (end,) = struct.unpack("<I", raw)
            size = out["journal_bytes"]
            out["journal_used"] = end if size is not None and end <= size else size
    with contextlib.suppress(OSError):
        out["dump_bytes"] = dump.stat().st_size
    return out


class Monitor:
    """Samples every node of a cluster every ``interval`` s on a daemon thread, from
    ``start()`` until ``stop()`` or ``deadline`` (monotonic), whichever is first.

    ``nodes`` returns ``{node id: (pid or None if not running, data directory)}``; it
    is called on the sampling thread, so it must be safe there (reading
    ``LocalCluster.procs`` is: the nemesis only replaces entries). ``samples`` is a
    list of plain dicts (``t`` seconds since ``start``, ``node``, ``pid``,
    ``running``, and the ``process_stats`` and ``file_sizes`` fields).
    """

    def __init__(
        self,
        nodes: Callable[[], Mapping[str, tuple[int | None, Path]]],
        interval: float = SAMPLE_EVERY,
        deadline: float | None = None,
    ) -> None:
        self.nodes = nodes
        self.interval = interval
        self.deadline = deadline if deadline is not None else time.monotonic() + 86_400
        self.samples: list[Sample] = []
        self.t0 = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-monitor", daemon=True)

    def start(self) -> Monitor:
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take one last sample and stop (blocks up to a few seconds)."""
        if self._stop.is_set() or not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join(timeout=10)

    def sample(self) -> list[Sample]:
        now = round(time.monotonic() - self.t0, 2)
        out = []
        for node, (pid, directory) in sorted(self.nodes().items()):
            row: Sample = {"t": now, "node": node, "pid": pid, "running": False}
            stats = process_stats(pid) if pid is not None else None
            if stats is not None:
                row.update(stats, running=True)
            row.update(file_sizes(directory))
            out.append(row)
        self.samples.extend(out)
        return out

    def _run(self) -> None:
        while time.monotonic() < self.deadline:
            self.sample()
            if self._stop.wait(self.interval):
                break
        self.sample()  # the last one, at the end of the load


# ------------------------------------------------------------------ verdicts


def windows(duration: float) -> tuple[tuple[float, float], tuple[float, float], str]:
    """The reference window and the last window for a run of ``duration`` seconds
    (times relative to the first sample), and a note on what is compared."""
    warm = WARMUP_MINUTES * 60
    last = (max(0.0, duration - WINDOW), duration)
    if duration >= warm + WINDOW:
        return (
            (warm, warm + WINDOW),
            last,
            (f"minute {WARMUP_MINUTES:g}-{WARMUP_MINUTES + 1:g} against the last minute"),
        )
    return (
        (0.0, min(WINDOW, duration)),
        last,
        (
            f"run shorter than {WARMUP_MINUTES + 1:g} minutes: the first minute (warm-up "
            "included) against the last minute"
        ),
    )


def _values(samples: Iterable[Sample], field: str, lo: float, hi: float) -> list[float]:
    """``field`` of the samples in ``[lo, hi]`` of a running process at least
    ``MIN_AGE`` s old."""
    out = []
    for s in samples:
        value = s.get(field)
        if not lo <= s["t"] <= hi or not isinstance(value, int | float):
            continue
        if not s.get("running") or float(s.get("age", 0.0)) < MIN_AGE:
            continue
        out.append(float(value))
    return out


def _window_values(
    samples: list[Sample], field: str, window: tuple[float, float], forward: bool
) -> tuple[list[float], tuple[float, float]]:
    """The window's values, widened (forward or backward, at most ``WIDEN`` s) until
    it holds ``MIN_SAMPLES``; returns them and the window used."""
    lo, hi = window
    step = WIDEN / 4
    widened = 0.0
    while True:
        values = _values(samples, field, lo, hi)
        if len(values) >= MIN_SAMPLES or widened >= WIDEN:
            return values, (lo, hi)
        widened += step
        if forward:
            hi += step
        else:
            lo = max(0.0, lo - step)


def compare(
    samples: list[Sample],
    field: str,
    ref: tuple[float, float],
    last: tuple[float, float],
    limit: Callable[[float, float], tuple[bool, str]],
) -> dict[str, Any]:
    """Median of ``field`` over ``ref`` against the median over ``last`` (samples of
    processes at least ``MIN_AGE`` s old); ``limit(ref median, last median)`` says
    whether that passes and why. ``valid`` is ``"unknown"`` when a window lacks
    ``MIN_SAMPLES`` usable samples."""
    a, ref_used = _window_values(samples, field, ref, True)
    b, last_used = _window_values(samples, field, last, False)
    out: dict[str, Any] = {
        "ref_window": [round(x, 1) for x in ref_used],
        "last_window": [round(x, 1) for x in last_used],
        "ref_samples": len(a),
        "last_samples": len(b),
    }
    if len(a) < MIN_SAMPLES or len(b) < MIN_SAMPLES:
        out.update(valid="unknown", why=f"fewer than {MIN_SAMPLES} usable samples in a window")
        return out
    first, final = statistics.median(a), statistics.median(b)
    ok, why = limit(first, final)
    out.update(valid=ok, ref=first, last=final, why=why)
    return out


def rss_limit(first: float, final: float) -> tuple[bool, str]:
    """RSS: growth below ``RSS_GROWTH``."""
    growth = (final - first) / first if first > 0 else float("inf")
    return growth < RSS_GROWTH, f"growth {growth:+.1%} (limit {RSS_GROWTH:.0%})"


def count_limit(first: float, final: float) -> tuple[bool, str]:
    """Fds and threads: growth of at most ``COUNT_JITTER``."""
    return final - first <= COUNT_JITTER, f"growth {final - first:+g} (limit +{COUNT_JITTER})"


def bounded_size(samples: list[Sample], field: str, start: float) -> dict[str, Any]:
    """The bounded-size rule for ``field`` (a node's journal or dump) over the samples
    from ``start`` on (every sample, whether the node was running or not: the file
    is there either way)."""
    series = sorted(
        (s["t"], float(s[field]))
        for s in samples
        if isinstance(s.get(field), int | float) and s["t"] >= start
    )
    if not series:
        return {"valid": "unknown", "why": "no samples"}
    middle = (series[0][0] + series[-1][0]) / 2
    first = [v for t, v in series if t <= middle]
    second = [v for t, v in series if t > middle]
    out: dict[str, Any] = {
        "halves": [round(series[0][0], 1), round(middle, 1), round(series[-1][0], 1)],
        "first_samples": len(first),
        "second_samples": len(second),
    }
    if len(first) < MIN_SAMPLES or len(second) < MIN_SAMPLES:
        out.update(valid="unknown", why=f"fewer than {MIN_SAMPLES} samples in a half")
        return out
    first_peak = statistics.median(peaks([(t, v) for t, v in series if t <= middle]))
    second_peak = statistics.median(peaks([(t, v) for t, v in series if t > middle]))
    ceiling = SIZE_FACTOR * first_peak + SIZE_SLACK
    problems = []
    if second_peak > ceiling:
        problems.append(
            f"second half's median peak {second_peak:.0f} B above {SIZE_FACTOR:g} x the "
            f"first half's {first_peak:.0f} B + {SIZE_SLACK} B"
        )
    run = longest_growth(series)
    if run["seconds"] >= NO_SHRINK_SPAN and run["grew"] > SIZE_SLACK:
        problems.append(
            f"grew {run['grew']:.0f} B over {run['seconds']:.0f} s without shrinking once"
        )
    out.update(
        valid=not problems,
        ref=first_peak,
        last=second_peak,
        max=max(v for _, v in series),
        longest_growth=run,
        why="; ".join(problems)
        or (
            f"second half's median peak {second_peak:.0f} B <= {ceiling:.0f} B; longest "
            f"growth without a shrink {run['seconds']:.0f} s"
        ),
    )
    return out


def peaks(series: list[tuple[float, float]]) -> list[float]:
    """The sizes of ``(t, size)`` just before each shrink (the series' maximum if it
    never shrank)."""
    out = [v for (_, v), (_, after) in itertools.pairwise(series) if after < v]
    return out or [max(v for _, v in series)]


def longest_growth(series: list[tuple[float, float]]) -> dict[str, float]:
    """The longest stretch of ``(t, size)`` over which the size never decreased: its
    length in seconds and how much it grew."""
    best = {"seconds": 0.0, "grew": 0.0, "from": 0.0}
    start = 0
    for i in range(1, len(series) + 1):
        if i == len(series) or series[i][1] < series[i - 1][1]:
            seconds = series[i - 1][0] - series[start][0]
            if seconds > best["seconds"]:
                best = {
                    "seconds": round(seconds, 1),
                    "grew": series[i - 1][1] - series[start][1],
                    "from": series[start][0],
                }
            start = i
    return best


def restarts(samples: list[Sample]) -> dict[str, Any]:
    """Per node: how many processes were seen, and the longest-lived one (pid, seconds
    sampled, RSS when first and last sampled at least ``MIN_AGE`` s old)."""
    out: dict[str, Any] = {}
    nodes = sorted({s["node"] for s in samples})
    for node in nodes:
        rows = [s for s in samples if s["node"] == node and s.get("running")]
        by_pid: dict[int, list[Sample]] = {}
        for s in rows:
            by_pid.setdefault(int(s["pid"]), []).append(s)
        longest: dict[str, Any] = {}
        for pid, group in by_pid.items():
            span = group[-1]["t"] - group[0]["t"]
            if not longest or span > longest["seconds"]:
                old = [s for s in group if float(s.get("age", 0.0)) >= MIN_AGE]
                longest = {
                    "pid": pid,
                    "seconds": round(span, 1),
                    "rss_kb_first": old[0]["rss_kb"] if old else None,
                    "rss_kb_last": old[-1]["rss_kb"] if old else None,
                }
        out[node] = {"processes": len(by_pid), "longest": longest}
    return out


def verdict(samples: list[Sample]) -> dict[str, Any]:
    """Every rule for every node, and the overall ``valid``: False if any rule failed,
    else ``"unknown"`` if any could not decide (or there are no samples), else True."""
    if not samples:
        return {"valid": "unknown", "why": "no samples", "nodes": {}, "restarts": {}}
    t_first = min(s["t"] for s in samples)
    rows = [{**s, "t": s["t"] - t_first} for s in samples]
    duration = max(s["t"] for s in rows)
    ref, last, note = windows(duration)
    if duration < 2 * WINDOW:
        return {
            "valid": "unknown",
            "why": f"sampled for {duration:.0f} s: two one-minute windows need 120 s",
            "nodes": {},
            "restarts": restarts(rows),
        }
    nodes: dict[str, dict[str, Any]] = {}
    for node in sorted({s["node"] for s in rows}):
        mine = [s for s in rows if s["node"] == node]
        rules: dict[str, Any] = {"rss": compare(mine, "rss_kb", ref, last, rss_limit)}
        for field in COUNTS:
            rules[field] = compare(mine, field, ref, last, count_limit)
        rules["journal"] = bounded_size(mine, "journal_used", ref[0])
        rules["dump"] = bounded_size(mine, "dump_bytes", ref[0])
        nodes[node] = rules
    verdicts = [rule["valid"] for rules in nodes.values() for rule in rules.values()]
    valid: bool | str = True
    if any(v is False for v in verdicts):
        valid = False
    elif any(v == "unknown" for v in verdicts):
        valid = "unknown"
    failed = [
        f"{node} {name}: {rule.get('why')}"
        for node, rules in nodes.items()
        for name, rule in rules.items()
        if rule["valid"] is not True
    ]
    return {
        "valid": valid,
        "duration": round(duration, 1),
        "windows": {"ref": list(ref), "last": list(last), "note": note},
        "failed": failed,
        "nodes": nodes,
        "restarts": restarts(rows),
    }


def series(samples: list[Sample]) -> dict[str, dict[str, list[Any]]]:
    """The samples as columns per node (``t``, ``pid``, ``rss_kb``, ...), for
    results.json."""
    out: dict[str, dict[str, list[Any]]] = {}
    for s in samples:
        columns = out.setdefault(s["node"], {f: [] for f in SERIES_FIELDS})
        for f in SERIES_FIELDS:
            columns[f].append(s.get(f))
    return out


def summary_lines(result: Mapping[str, Any]) -> list[str]:
    """A few lines for the run's printed summary."""
    lines = [f"soak {result['valid']!s:8} {result.get('windows', {}).get('note', '')}"]
    for node, rules in result.get("nodes", {}).items():
        rss, fds, threads = rules["rss"], rules["fds"], rules["threads"]
        journal, dump = rules["journal"], rules["dump"]
        procs = result.get("restarts", {}).get(node, {}).get("processes")
        lines.append(
            f"  {node}: rss {_num(rss.get('ref'))} -> {_num(rss.get('last'))} KiB "
            f"({rss.get('why')}), fds {_num(fds.get('ref'))} -> {_num(fds.get('last'))} "
            f"(besides accepted connections), "
            f"threads {_num(threads.get('ref'))} -> {_num(threads.get('last'))}, journal "
            f"max {_num(journal.get('max'))} B, dump max {_num(dump.get('max'))} B, "
            f"processes {procs}"
        )
    for line in result.get("failed", [])[:10]:
        lines.append(f"  not passed: {line}")
    return lines


def _num(value: Any) -> str:
    return f"{value:.0f}" if isinstance(value, int | float) else "-"
