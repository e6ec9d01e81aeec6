"""``raftlease watch``, ``sessions``, ``waiters`` and ``revoke`` (issue 13) on real node
processes, human and ``--json`` output, revoke refused without the admin permission
when auth is on; and the CLI ergonomics: durations, the owner default, booleans in
``node --set``.

The unit half of these tests (no process); the integration half is
tests/integration/test_cli_admin.py."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from raftlease.cli import main
from raftlease.cli.common import DURATION, TTL, parse_setting

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------- ergonomics


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("250ms", 0.25), ("1.5", 1.5), ("0", 0.0)],
)
def test_durations_parse(text: str, seconds: float) -> None:
    assert DURATION.convert(text, None, None) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5x", "-1s", "s", "", "inf", "nan", "1e999", "ten", "5 m m"])
def test_bad_durations_are_refused_with_a_clear_message(text: str) -> None:
    with pytest.raises(click.BadParameter, match="not a duration"):
        DURATION.convert(text, None, None)


def test_a_negative_ttl_is_left_to_the_node() -> None:
    # The node refuses it with a definite INVALID_ARGUMENT (tests/integration/test_cli.py).
    assert TTL.convert("-1", None, None) == -1.0
    assert TTL.convert("-2m", None, None) == -120.0
    with pytest.raises(click.BadParameter, match="not a duration"):
        TTL.convert("-inf", None, None)


def test_a_bad_duration_on_the_command_line_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["acquire", "k", "--ttl", "5x"])
    assert result.exit_code == 2
    assert "not a duration" in result.output and "30s" in result.output


def test_set_accepts_booleans_for_boolean_fields() -> None:
    for text in ("true", "TRUE", "yes", "on", "1"):
        assert parse_setting(f"insecure={text}") == ("insecure", True)
    for text in ("false", "no", "off", "0"):
        assert parse_setting(f"insecure={text}") == ("insecure", False)
    assert parse_setting("max_ttl=60") == ("max_ttl", 60)  # other fields: numbers as before
    with pytest.raises(click.BadParameter, match="insecure is true or false"):
        parse_setting("insecure=maybe")


def test_set_on_the_node_command() -> None:
    runner = CliRunner()
    bad = runner.invoke(main, ["node", "--set", "insecure=maybe"])
    assert bad.exit_code == 2 and "insecure is true or false" in bad.output
    # test_hooks is no production setting at all (test builds get hooks another way):
    # a boolean is accepted as a value, and the key is refused by name.
    hooks = runner.invoke(main, ["node", "--set", "test_hooks=true"])
    assert hooks.exit_code == 2
    assert "unknown configuration keys: test_hooks" in hooks.output
    assert "must be true or false" not in hooks.output
