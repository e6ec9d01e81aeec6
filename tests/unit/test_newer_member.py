"""``newer_member``: which incoming peer connection naming no member of this node's
set is taken as a member of a newer configuration (docs/membership.md, "A member that
missed a change")."""

from __future__ import annotations

from raftlease.config import NodeAddress
from raftlease.replication.membership import newer_member

ME = NodeAddress("n3", "127.0.0.1:7103", "127.0.0.1:7003")
OURS = (
    NodeAddress("n1", "127.0.0.1:7101", "127.0.0.1:7001"),
    NodeAddress("n2", "127.0.0.1:7102", "127.0.0.1:7002"),
)


def test_a_certified_member_unknown_to_us_at_an_unknown_address_is_accepted() -> None:
    assert newer_member("127.0.0.1:7104", ["n4"], OURS, ME) == "n4"
    assert newer_member("127.0.0.1:7104", ["n4", "n4"], OURS, ME) == "n4"


def test_a_certificate_naming_no_member_or_several_is_refused() -> None:
    assert newer_member("127.0.0.1:7104", [], OURS, ME) is None
    assert newer_member("127.0.0.1:7104", ["n4", "n5"], OURS, ME) is None


def test_a_member_of_ours_at_another_address_is_an_impostor_not_a_newcomer() -> None:
    assert newer_member("127.0.0.1:7104", ["n1"], OURS, ME) is None
    assert newer_member("127.0.0.1:7104", ["n3"], OURS, ME) is None  # our own id


def test_a_new_id_claiming_a_members_address_or_ours_is_refused() -> None:
    assert newer_member("127.0.0.1:7101", ["n4"], OURS, ME) is None
    assert newer_member("127.0.0.1:7103", ["n4"], OURS, ME) is None


def test_a_first_frame_that_is_no_raft_address_is_refused() -> None:
    for frame in (None, "", "readonly", ["status"], 7104, b"127.0.0.1:7104"):
        assert newer_member(frame, ["n4"], OURS, ME) is None


def test_an_address_no_node_could_be_built_from_is_refused() -> None:
    """A malformed address raised on the tick thread when the guest's node was built."""
    for frame in (
        "h:abc",
        ":7104",
        "127.0.0.1:",
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "127.0.0.1:" + "9" * 5000,
        "127.0.0.1:７１０４",  # fullwidth digits: isdigit() but not ASCII
        "h" * 300 + ":7104",
    ):
        assert newer_member(frame, ["n4"], OURS, ME) is None, frame
    assert newer_member("node-4.example:7104", ["n4"], OURS, ME) == "n4"


def test_a_member_our_log_removed_is_refused_by_id_or_address() -> None:
    assert newer_member("127.0.0.1:7104", ["n4"], OURS, ME, {"n4"}) is None
    assert newer_member("127.0.0.1:7104", ["n4"], OURS, ME, {"127.0.0.1:7104"}) is None
    assert newer_member("127.0.0.1:7104", ["n4"], OURS, ME, {"n5"}) == "n4"
