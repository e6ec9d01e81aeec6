"""The chaos run's report (jepsen-style/timeline.py, issue 44), on small in-memory
histories: no cluster, no browser.

The page names the run and its verdict in words, lists the checkers and the faults as
tables of readable values (not JSON), lays fault labels out so that no two overlap
however dense the schedule, colours every fault category (``membership`` included, a
new one generically), and escapes the history's text.
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

SUITE = Path(__file__).resolve().parents[2] / "jepsen-style"
sys.path.insert(0, str(SUITE))

import nemesis  # noqa: E402
import timeline  # noqa: E402

T0 = 1000.0
CATEGORIES = {k: v[0] for k, v in nemesis.KINDS.items()}


def meta(**extra: Any) -> dict[str, Any]:
    return {
        "type": "meta",
        "t": T0,
        "seed": 1,
        "profile": "ci",
        "nodes": 3,
        "clients": 2,
        "keys": ["k1"],
        "planted_bug": "",
        **extra,
    }


def lease(process: str, key: str, token: int, start: float, end: float) -> list[dict[str, Any]]:
    """An acquire granted at ``start`` and released at ``end``."""
    op = f"{process}:{token}"
    return [
        {"type": "invoke", "f": "acquire", "key": key, "op": op, "process": process,
         "t": start - 0.01, "value": {"owner": process, "ttl": 2.0}},
        {"type": "ok", "f": "acquire", "key": key, "op": op, "process": process, "t": start,
         "value": {"owner": process, "token": token, "ttl": 2.0, "valid_until": start + 2.0,
                   "lease": f"l{token}"}},
        {"type": "invoke", "f": "release", "key": key, "op": f"{op}r", "process": process,
         "t": end, "value": {"lease": f"l{token}", "token": token}},
        {"type": "ok", "f": "release", "key": key, "op": f"{op}r", "process": process,
         "t": end + 0.01, "value": {}},
    ]  # fmt: skip


def fault(ident: int, kind: str, start: float, stop: float | None, **detail: Any) -> list[Any]:
    out = [
        {"type": "nemesis", "f": "start", "fault": kind, "id": ident, "t": T0 + start,
         "detail": detail}
    ]  # fmt: skip
    if stop is not None:
        out.append(
            {"type": "nemesis", "f": "stop", "fault": kind, "id": ident, "t": T0 + stop,
             "detail": {"restarted": ["n2"]}}
        )  # fmt: skip
    return out


def history(*faults: list[Any], **meta_extra: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [meta(**meta_extra)]
    events += lease("c1", "k1", 1, T0 + 0.5, T0 + 2.0)
    events += lease("c2", "k1", 2, T0 + 2.5, T0 + 4.0)
    for f in faults:
        events += f
    events.append({"type": "invoke", "f": "read", "key": "k1", "op": "c1:9", "process": "c1",
                   "t": T0 + 10.0})  # fmt: skip
    return events


def checker_result(valid: Any, violations: list[Any] | None = None, **stats: Any) -> dict:
    violations = violations or []
    return {
        "valid": valid,
        "violation_count": len(violations),
        "violations": violations,
        "stats": stats,
    }


def results(**checkers: dict[str, Any]) -> dict[str, Any]:
    verdicts = [c["valid"] for c in checkers.values()]
    valid: Any = True
    if False in verdicts:
        valid = False
    elif "unknown" in verdicts:
        valid = "unknown"
    return {"valid": valid, "checkers": checkers, "volume": {"valid": None, "stats": {}}}


def passing() -> dict[str, Any]:
    return results(
        mutual_exclusion=checker_result(True, holding_intervals=2),
        fencing=checker_result(True, grants=2, resource_rejected=0),
        liveness=checker_result(True, heals=1, max_recovery=0.25),
    )


def failing() -> dict[str, Any]:
    overlap = {
        "key": "k1",
        "t": T0 + 2.6,
        "overlap": 0.4,
        "first": {"process": "c1", "token": 1},
        "second": {"process": "c2", "token": 2},
    }
    return results(
        mutual_exclusion=checker_result(False, [overlap], holding_intervals=2),
        fencing=checker_result(
            False,
            [{"kind": "token handed out twice", "t": T0 + 3.0, "token": 2}] * 5,
            grants=2,
        ),
        liveness=checker_result(True, heals=1),
    )


def render(events: list[dict[str, Any]], res: dict[str, Any]) -> str:
    return timeline.render(events, res, CATEGORIES)


class Tables(HTMLParser):
    """The page's ``<title>``, ``<h2>`` text and table rows, as plain text."""

    def __init__(self) -> None:
        super().__init__()
        self.title = ""
        self.heading = ""
        self.rows: dict[str, list[list[str]]] = {}
        self._in: str | None = None
        self._row: list[str] | None = None
        self._row_class = ""
        self._done: dict[str, bool] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("title", "h2") and self._in is None and not self._done.get(tag):
            self._in = tag  # the page's own, not the SVG's tooltips
        elif tag == "tr":
            self._row_class = dict(attrs).get("class") or ""
            self._row = []
        elif tag == "td" and self._row is not None:
            self._row.append("")
        elif tag == "br" and self._row:
            self._row[-1] += "\n"

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self._done[tag] = True
            self._in = None
        elif tag == "tr" and self._row is not None:
            if self._row_class:
                self.rows.setdefault(self._row_class, []).append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._in == "title":
            self.title += data
        elif self._in == "h2":
            self.heading += data
        elif self._row:
            self._row[-1] += data


def parse(page: str) -> Tables:
    tables = Tables()
    tables.feed(page)
    return tables


# ----------------------------------------------------------------- title


def test_title_of_a_passing_run_names_the_run_and_says_passed() -> None:
    page = parse(render(history(fault(1, "kill-leader", 1.0, 3.0)), passing()))
    want = "raftlease chaos run — seed 1, profile ci, 3 nodes — PASSED (every checker valid)"
    assert page.title == want
    assert page.heading == want
    assert "True" not in page.title


def test_title_of_a_failing_run_names_the_failed_checkers() -> None:
    page = parse(render(history(fault(1, "kill-leader", 1.0, 3.0)), failing()))
    assert page.title.endswith("— FAILED: mutual_exclusion, fencing")
    assert page.heading == page.title


def test_title_of_an_unknown_run_names_the_undecided_checkers() -> None:
    res = results(
        mutual_exclusion=checker_result(True),
        liveness={**checker_result("unknown"), "unknown": [{"kind": "no heal measured"}]},
    )
    page = parse(render(history(), res))
    assert page.title == "raftlease chaos run — seed 1, profile ci, 3 nodes — UNKNOWN: liveness"


def test_title_counts_a_short_volume_as_unknown_and_a_planted_bug() -> None:
    res = passing()
    res["valid"] = "unknown"
    res["volume"] = {"valid": False, "violations": [{"kind": "too few grants"}], "stats": {}}
    page = parse(render(history(planted_bug="skip-fence"), res))
    assert page.title == (
        "raftlease chaos run — seed 1, profile ci, 3 nodes, planted bug skip-fence"
        " — UNKNOWN: volume"
    )


def test_title_without_a_verdict_is_unknown() -> None:
    assert timeline.verdict({}) == ("unknown", "UNKNOWN: no verdict recorded")


# ----------------------------------------------------------------- tables


def test_checker_table_has_a_row_per_checker_with_readable_statistics() -> None:
    res = failing()
    res["checkers"]["linearizable"] = checker_result(
        True, k1={"ops": 390, "seconds": 0.0061, "result": True}, skipped=["pool1", "sem1"]
    )
    rows = parse(render(history(), res)).rows["checker"]
    assert [r[0] for r in rows] == ["mutual_exclusion", "fencing", "liveness", "linearizable"]
    _, verdict, count, stats, first = rows[0]
    assert (verdict, count) == ("INVALID", "1")
    assert stats == "holding_intervals: 2"
    # The violation in words: time into the run, nested fields named by dots.
    assert first.startswith("at 2.600 s; key: k1; overlap: 0.4; first.process: c1")
    assert "{" not in first and '"' not in first
    fencing = rows[1]
    assert fencing[2] == "5"
    assert fencing[4].split("\n") == ["token handed out twice; at 3.000 s; token: 2"] * 3 + [
        "… and 2 more"
    ]
    assert rows[2][1] == "valid"
    assert rows[3][3].split("\n") == [
        "k1.ops: 390",
        "k1.seconds: 0.006",
        "k1.result: yes",
        "skipped: pool1, sem1",
    ]


def test_checker_table_colours_verdicts_and_gives_unknown_reasons() -> None:
    res = results(
        ok=checker_result(True),
        bad=checker_result(False, [{"kind": "x"}]),
        maybe={**checker_result("unknown"), "unknown": [{"kind": "no final state recorded"}]},
    )
    page = render(history(), res)
    colours = re.findall(r'<td class="verdict" style="color:(#[0-9a-f]{6})">(\w+)</td>', page)
    assert colours == [("#2ca02c", "valid"), ("#d62728", "INVALID"), ("#ff7f0e", "unknown")]
    maybe = parse(page).rows["checker"][2]
    assert maybe[4] == "unknown: no final state recorded"


def test_fault_table_lists_every_fault_in_words() -> None:
    events = history(
        fault(1, "kill-leader", 1.0, 3.5, killed="n1", members=["n1", "n2", "n3"]),
        fault(2, "membership-missed", 4.0, 7.0, added="x1", learned=True),
        fault(3, "brand-new-kind", 8.0, None),
    )
    rows = parse(render(events, passing())).rows["fault"]
    assert [r[:5] for r in rows] == [
        ["1", "kill-leader", "process", "1.00 s", "2.50 s"],
        ["2", "membership-missed", "membership", "4.00 s", "3.00 s"],
        ["3", "brand-new-kind", "other", "8.00 s", "never healed"],
    ]
    assert rows[0][5] == "killed: n1; members: n1, n2, n3\nheal: restarted: n2"
    assert rows[1][5].startswith("added: x1; learned: yes")


def test_every_category_has_a_colour_membership_included() -> None:
    assert timeline.category_colour("membership") == timeline.CATEGORY_COLOURS["membership"]
    for category in {c for c, _ in nemesis.KINDS.values()}:
        assert category in timeline.CATEGORY_COLOURS, category
    # A category nobody coloured yet gets one of its own, the same every time.
    new = timeline.category_colour("brand-new")
    assert new == timeline.category_colour("brand-new")
    assert new.startswith("hsl(") and new != timeline.category_colour("other")


# ----------------------------------------------------------------- labels


def boxes_of(page: str) -> list[tuple[float, float, float, float]]:
    out = []
    for attrs in re.findall(r'<rect class="label-box" ([^>]*)/>', page):
        got = dict(re.findall(r'(\w+)="([^"]*)"', attrs))
        x, y, w, h = (float(got[k]) for k in ("x", "y", "width", "height"))
        out.append((x, y, x + w, y + h))
    return out


def overlapping(boxes: list[tuple[float, float, float, float]]) -> list[tuple[int, int]]:
    return [
        (i, j)
        for i, a in enumerate(boxes)
        for j, b in enumerate(boxes[i + 1 :], i + 1)
        if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
    ]


def test_no_two_fault_labels_overlap_for_a_dense_schedule() -> None:
    kinds = list(nemesis.KINDS)
    faults = [
        fault(i + 1, kinds[i % len(kinds)], 0.3 * i, 0.3 * i + 1.5 + (i % 4)) for i in range(30)
    ]
    page = render(history(*faults), passing())
    boxes = boxes_of(page)
    assert len(boxes) == 30
    assert overlapping(boxes) == []
    # Each label is its fault's own, at its band's start, and wide enough for its text
    # (the text is forced to that width with textLength, whatever the font).
    texts = re.findall(r'class="flabel" textLength="([\d.]+)"[^>]*>([^<]*)</text>', page)
    assert [t for _, t in texts] == [f"#{i + 1} {kinds[i % len(kinds)]}" for i in range(30)]
    for (x0, _, x1, _), (length, text) in zip(boxes, texts, strict=True):
        assert float(length) == round(len(text) * timeline.LABEL_CHAR, 1)
        assert x1 - x0 >= float(length)
    # The lanes start below the last label row; the page is wide enough for every label.
    lane = float(re.search(r'<rect x="0" y="([\d.]+)"', page).group(1))  # type: ignore[union-attr]
    assert lane >= max(b[3] for b in boxes)
    width = float(re.search(r'<svg [^>]*width="([\d.]+)"', page).group(1))  # type: ignore[union-attr]
    assert width >= max(b[2] for b in boxes)


def test_label_layout_packs_rows_greedily_and_never_overlaps() -> None:
    items = [(x * 7.0 % 400, f"#{x} kill-leader") for x in range(60)]
    boxes = timeline.layout_labels(items)
    assert [b.text for b in boxes] == [t for _, t in items]
    as_rects = [(b.x0, b.y0, b.x1, b.y1) for b in boxes]
    assert overlapping(as_rects) == []
    # Labels far apart share the first row.
    apart = timeline.layout_labels([(0.0, "a"), (100.0, "b"), (200.0, "c")])
    assert [b.row for b in apart] == [0, 0, 0]
    # Greedy packing: no more rows than the most labels covering one x.
    widest = max(sum(1 for b in boxes if b.x0 <= x < b.x1 + timeline.LABEL_GAP) for x, _ in items)
    assert 1 + max(b.row for b in boxes) <= widest


# ----------------------------------------------------------------- escaping


HOSTILE = '<script>alert("x")</script>&\'"'


def test_hostile_history_text_is_escaped_everywhere() -> None:
    events = history(
        fault(1, HOSTILE, 1.0, 2.0, note=HOSTILE),
        fault(2, "kill-leader", 2.0, 3.0, **{HOSTILE: HOSTILE}),
        profile=HOSTILE,
        seed=HOSTILE,
    )
    events += lease(HOSTILE, HOSTILE, 7, T0 + 5.0, T0 + 6.0)
    res = results(
        **{HOSTILE: checker_result(False, [{"kind": HOSTILE, "t": T0 + 1, HOSTILE: [HOSTILE]}])}
    )
    res["harness_errors"] = [HOSTILE]
    page = render(events, res)
    assert "<script" not in page
    assert "alert(&quot;x&quot;)" in page
    assert page.count("&lt;script&gt;") >= 8
    parsed = parse(page)
    assert HOSTILE in parsed.title and parsed.title.endswith(f"FAILED: {HOSTILE}")
    assert parsed.rows["checker"][0][0] == HOSTILE
    assert parsed.rows["fault"][0][1] == HOSTILE
