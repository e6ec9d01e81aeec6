"""The soak profile's verdicts (jepsen-style/soak.py) on synthetic series: no cluster.

Each rule passes a flat (or sawtooth) series and fails one that grows: RSS by 10 %
or more between the reference window and the last minute, fds or threads by more
than 5, a journal or dump that grows without compaction. The reference window is
minute 5-6 in a run of 6 minutes or more, the first minute in a shorter one; samples
of a process younger than ``MIN_AGE`` (restarted by a fault) are left out; a window
without enough samples is ``unknown``, never a pass. Also: the monitor reads a real
process's /proc entries and a journal header, and the ``soak`` schedule fills its
minutes with every fault kind.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jepsen-style"))
import nemesis
import soak

MIB = 1024 * 1024


def run(
    minutes: float,
    rss: Callable[[float], float] = lambda t: 60_000.0,
    fds: Callable[[float], int] = lambda t: 30,
    threads: Callable[[float], int] = lambda t: 12,
    journal: Callable[[float], int] = lambda t: int(200_000 + 10_000 * (t % 30)),
    dump: Callable[[float], int] = lambda t: 80_000,
    every: float = 10.0,
    nodes: tuple[str, ...] = ("n1", "n2"),
    pid: Callable[[float], int] = lambda t: 1000,
    age: Callable[[float], float] | None = None,
) -> list[dict[str, Any]]:
    """Samples every ``every`` s for ``minutes``; each field a function of the time t
    (seconds since the first sample). A process's age defaults to t + 60."""
    samples = []
    steps = int(minutes * 60 / every)
    for i in range(steps + 1):
        t = i * every
        for node in nodes:
            samples.append(
                {
                    "t": t,
                    "node": node,
                    "pid": pid(t),
                    "running": True,
                    "age": (age(t) if age else t + 60.0),
                    "rss_kb": rss(t),
                    "fds": fds(t),
                    "threads": threads(t),
                    "journal_bytes": 4 * MIB,
                    "journal_used": journal(t),
                    "dump_bytes": dump(t),
                }
            )
    return samples


def failed_rules(result: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (node, name)
        for node, rules in result["nodes"].items()
        for name, rule in rules.items()
        if rule["valid"] is False
    }


def test_flat_series_pass_every_rule() -> None:
    result = soak.verdict(run(30))
    assert result["valid"] is True, result["failed"]
    assert result["windows"]["ref"] == [300.0, 360.0]
    assert result["windows"]["last"] == [1740.0, 1800.0]
    assert "minute 5-6" in result["windows"]["note"]
    rules = result["nodes"]["n1"]
    assert set(rules) == {"rss", "fds", "threads", "journal", "dump"}
    assert rules["rss"]["ref"] == rules["rss"]["last"] == 60_000.0


def test_rss_growth_of_ten_percent_after_warmup_fails() -> None:
    # Warm-up growth in the first five minutes is left out; then 12 % more by the end.
    def rss(t: float) -> float:
        return 40_000 + 20_000 * min(t, 300) / 300 + (7_200 * (t - 360) / 1440 if t > 360 else 0)

    result = soak.verdict(run(30, rss=rss))
    assert result["valid"] is False
    assert failed_rules(result) == {("n1", "rss"), ("n2", "rss")}
    rule = result["nodes"]["n1"]["rss"]
    assert rule["ref"] == pytest.approx(60_000, rel=0.01)
    assert "limit 10%" in rule["why"]


def test_rss_growth_just_under_ten_percent_passes() -> None:
    result = soak.verdict(run(30, rss=lambda t: 60_000 + 5_000 * max(0.0, t - 330) / 1470))
    assert result["nodes"]["n1"]["rss"]["valid"] is True


def test_short_run_compares_the_first_minute_with_the_last() -> None:
    result = soak.verdict(run(3, rss=lambda t: 60_000 + 3_000 * t / 180))
    assert result["windows"]["ref"] == [0.0, 60.0]
    assert result["windows"]["last"] == [120.0, 180.0]
    assert "shorter than 6 minutes" in result["windows"]["note"]
    assert result["nodes"]["n1"]["rss"]["valid"] is True  # +3.3 %
    grown = soak.verdict(run(3, rss=lambda t: 60_000 + 12_000 * t / 180))
    assert ("n1", "rss") in failed_rules(grown)


def test_too_short_a_run_is_unknown() -> None:
    result = soak.verdict(run(1.5))
    assert result["valid"] == "unknown" and "120 s" in result["why"]
    assert soak.verdict([])["valid"] == "unknown"


@pytest.mark.parametrize("field", ["fds", "threads"])
def test_counts_may_jitter_by_five_but_not_grow(field: str) -> None:
    def jitter(t: float) -> int:
        return 30 + int(t // 10) % 6  # 30..35

    def grows(t: float) -> int:
        return 30 + int(t // 60)  # one more every minute

    assert soak.verdict(run(30, **{field: jitter}))["nodes"]["n1"][field]["valid"] is True
    result = soak.verdict(run(30, **{field: grows}))
    assert failed_rules(result) == {("n1", field), ("n2", field)}
    assert "limit +5" in result["nodes"]["n1"][field]["why"]


def test_journal_that_compaction_keeps_small_passes_and_one_that_grows_fails() -> None:
    assert soak.verdict(run(30))["nodes"]["n1"]["journal"]["valid"] is True
    # Compaction stopped at minute 10: the journal grows from then on.
    stuck = soak.verdict(
        run(30, journal=lambda t: 300_000 + (int(1_000 * (t - 600)) if t > 600 else 0))
    )
    rule = stuck["nodes"]["n1"]["journal"]
    assert rule["valid"] is False
    assert "without shrinking once" in rule["why"]
    assert "second half's median peak" in rule["why"] and "above 1.5 x" in rule["why"]


def test_slow_growth_without_any_shrink_fails_even_under_the_ceiling() -> None:
    # 300 KB more over 25 minutes (the second half's peak below 1.5 x the first's), but
    # never one shrink.
    result = soak.verdict(run(30, dump=lambda t: 600_000 + int(200 * t)))
    rule = result["nodes"]["n1"]["dump"]
    assert rule["valid"] is False and "without shrinking once" in rule["why"]
    assert "above" not in rule["why"]
    assert rule["longest_growth"]["seconds"] >= 1400


def test_a_sawtooth_with_uneven_peaks_passes() -> None:
    # Compaction at irregular moments (restarts): peaks between 0.4 and 1 MB in both
    # halves; one-minute windows would land on a trough in one place, a peak in another.
    def journal(t: float) -> int:
        period = 120 if (t // 600) % 2 else 50
        return int(20_000 * (t % period) * (1.0 if period == 50 else 0.4))

    rule = soak.verdict(run(30, journal=journal))["nodes"]["n1"]["journal"]
    assert rule["valid"] is True, rule
    assert rule["halves"] == [300.0, 1050.0, 1800.0]


def test_growth_of_a_dump_within_the_slack_passes() -> None:
    result = soak.verdict(run(30, dump=lambda t: 80_000 + int(30 * t)))  # +45 KB, no shrink
    assert result["nodes"]["n1"]["dump"]["valid"] is True


def test_restarted_processes_are_left_out_until_they_are_twenty_seconds_old() -> None:
    # n1 restarts every 100 s: a fresh process starts small (10 MB) and is 60 MB from
    # 20 s of age on. Its young samples must not count as a drop or a growth.
    def age(t: float) -> float:
        return t % 100

    def rss(t: float) -> float:
        return 10_000.0 if age(t) < soak.MIN_AGE else 60_000.0

    samples = run(30, rss=rss, age=age, pid=lambda t: 1000 + int(t // 100), nodes=("n1",))
    result = soak.verdict(samples)
    assert result["valid"] is True, result["failed"]
    assert result["restarts"]["n1"]["processes"] == 19
    assert result["restarts"]["n1"]["longest"]["seconds"] == 90.0


def test_a_window_without_usable_samples_is_unknown() -> None:
    # Every process is younger than MIN_AGE in every sample: nothing to compare.
    result = soak.verdict(run(10, age=lambda t: 5.0))
    assert result["valid"] == "unknown"
    assert result["nodes"]["n1"]["rss"]["valid"] == "unknown"
    # The sizes are judged anyway (the files are there whether or not the node runs).
    assert result["nodes"]["n1"]["journal"]["valid"] is True


def test_a_short_window_is_widened_to_find_samples() -> None:
    # One sample a minute: each one-minute window holds one; widened, it holds two.
    result = soak.verdict(run(12, every=60.0))
    rss = result["nodes"]["n1"]["rss"]
    assert rss["valid"] is True and rss["ref_samples"] >= 2 and rss["last_samples"] >= 2


def test_one_late_compaction_does_not_fail_a_short_run() -> None:
    # Peaks of ~360 KB, then one compaction comes late and the journal reaches 760 KB
    # (measured in a 3-minute soak): still the same sawtooth.
    def journal(t: float) -> int:
        return int(12_000 * (t % 60 if t >= 140 else t % 30))

    rule = soak.verdict(run(3, journal=journal))["nodes"]["n1"]["journal"]
    assert rule["valid"] is True, rule


def test_peaks() -> None:
    assert soak.peaks([(0.0, 1.0), (1.0, 3.0), (2.0, 0.0), (3.0, 2.0), (4.0, 1.0)]) == [3.0, 2.0]
    assert soak.peaks([(0.0, 1.0), (1.0, 5.0)]) == [5.0]


def test_longest_growth() -> None:
    series = [(0.0, 1.0), (10.0, 2.0), (20.0, 3.0), (30.0, 1.0), (40.0, 1.0), (50.0, 0.0)]
    assert soak.longest_growth(series) == {"seconds": 20.0, "grew": 2.0, "from": 0.0}
    assert soak.longest_growth([]) == {"seconds": 0.0, "grew": 0.0, "from": 0.0}


def test_series_are_columns_per_node() -> None:
    samples = run(1, nodes=("n1", "n2"))
    columns = soak.series(samples)
    assert set(columns) == {"n1", "n2"}
    assert columns["n1"]["t"] == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert set(columns["n1"]) == set(soak.SERIES_FIELDS)


def test_summary_lines_name_each_node_and_what_did_not_pass() -> None:
    result = soak.verdict(run(30, fds=lambda t: 30 + int(t // 60)))
    lines = soak.summary_lines(result)
    assert lines[0].startswith("soak False")
    assert any(line.startswith("  n1: rss 60000 -> 60000 KiB") for line in lines)
    assert any("not passed: n1 fds" in line for line in lines)


# ------------------------------------------------------------------ sampling


def test_process_stats_read_this_process() -> None:
    stats = soak.process_stats(os.getpid())
    assert stats is not None
    assert stats["rss_kb"] > 1000 and stats["threads"] >= 1 and stats["fds"] >= 3
    assert stats["age"] >= 0
    assert soak.process_stats(2**22 + 12345) is None  # above pid_max: never a process


def test_accepted_connections_are_counted_apart_and_a_leaked_socket_is_not() -> None:
    """A node's accepted connections follow its clients (``conns_in``) and are left out
    of the judged ``fds``; one whose client has closed (CLOSE_WAIT: what a socket leak
    looks like) stays in ``fds``."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        before = soak.process_stats(os.getpid())
        assert before is not None
        dialled = [socket.create_connection(server.getsockname()) for _ in range(3)]
        accepted = [server.accept()[0] for _ in dialled]
        try:
            during = soak.process_stats(os.getpid())
            assert during is not None
            # This process holds both ends: the 3 accepted ones are on the listening
            # port, the 3 dialled ones on ephemeral ports.
            assert during["conns_in"] - before["conns_in"] == 3
            assert during["fds_total"] - before["fds_total"] == 6
            assert during["fds"] - before["fds"] == 3
            dialled.pop().close()  # its accepted end goes to CLOSE_WAIT
            deadline = time.monotonic() + 10
            while True:
                after = soak.process_stats(os.getpid())
                assert after is not None
                if after["conns_in"] - before["conns_in"] == 2:
                    break
                assert time.monotonic() < deadline, after
                time.sleep(0.01)
            assert after["fds"] - before["fds"] == 3  # 2 dialled + the leaked one
        finally:
            for sock in dialled + accepted:
                sock.close()


def test_file_sizes_read_the_journal_header(tmp_path: Path) -> None:
    assert soak.file_sizes(tmp_path) == {
        "journal_bytes": None,
        "journal_used": None,
        "dump_bytes": None,
    }
    header = bytearray(4096)
    struct.pack_into("<I", header, soak.JOURNAL_END_AT, 1500)
    (tmp_path / "raft.journal").write_bytes(bytes(header))
    (tmp_path / "raft.dump").write_bytes(b"x" * 77)
    assert soak.file_sizes(tmp_path) == {
        "journal_bytes": 4096,
        "journal_used": 1500,
        "dump_bytes": 77,
    }


def test_file_sizes_match_pysyncobjs_journal(tmp_path: Path) -> None:
    """The header offset is PySyncObj's: a journal it wrote reports its used end."""
    from pysyncobj.journal import FileJournal

    path = tmp_path / "raft.journal"
    journal = FileJournal(str(path))
    try:
        journal.add(b"x" * 100, 1, 1)
        journal.add(b"y" * 50, 2, 1)
        journal.flush()
    finally:
        journal._destroy()
    sizes = soak.file_sizes(tmp_path)
    assert sizes["journal_used"] is not None and sizes["journal_bytes"] is not None
    header = soak.JOURNAL_END_AT + 4
    # Each record: size (4) + index and term (16) + command + size (4).
    assert sizes["journal_used"] == header + (24 + 100) + (24 + 50)
    assert sizes["journal_used"] <= sizes["journal_bytes"]


def test_monitor_samples_until_stopped(tmp_path: Path) -> None:
    monitor = soak.Monitor(lambda: {"n1": (os.getpid(), tmp_path), "n2": (None, tmp_path)}, 0.05)
    monitor.start()
    try:
        time.sleep(0.3)
    finally:
        monitor.stop()
    rows = monitor.samples
    assert {r["node"] for r in rows} == {"n1", "n2"}
    assert all(r["running"] for r in rows if r["node"] == "n1")
    assert not any(r["running"] for r in rows if r["node"] == "n2")
    assert len(rows) >= 4
    count = len(rows)
    monitor.stop()  # idempotent
    assert len(monitor.samples) == count


# ------------------------------------------------------------------ schedule


def test_soak_schedule_fills_its_minutes_with_every_kind() -> None:
    specs = nemesis.schedule("soak", 3)
    assert {s.kind for s in specs} == set(nemesis.KINDS)
    length = sum(s.duration + s.recovery for s in specs)
    assert 29 * 60 <= length <= 30 * 60
    short = nemesis.schedule("soak", 3, minutes=3)
    assert {s.kind for s in short} == set(nemesis.KINDS)
    assert sum(1 for s in specs if s.kind == "power-loss") >= 5
