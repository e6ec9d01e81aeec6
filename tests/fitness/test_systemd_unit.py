"""The systemd unit in cluster/ keeps its hardening (issue 11): parsed as an ini file,
since CI has no systemd to load it."""

from __future__ import annotations

import configparser
from pathlib import Path

UNIT = Path(__file__).resolve().parents[2] / "cluster" / "raftlease@.service"


def _service() -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    section = None
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def test_the_unit_parses() -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    assert parser.get("Service", "User") == "raftlease"


def test_the_unit_restricts_addresses_memory_and_privileges() -> None:
    service = _service()
    required = {
        "UMask": "0077",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
        "ProtectSystem": "strict",
        "IPAddressDeny": "any",
        "StateDirectoryMode": "0700",
    }
    for key, value in required.items():
        assert service.get(key) == [value], key
    assert service["MemoryMax"][0].endswith("G")
    assert service["IPAddressAllow"][0]
    assert "@system-service" in service["SystemCallFilter"]
    assert "RestartPreventExitStatus" in service


def test_the_unit_documents_the_admin_endpoint_and_log_format() -> None:
    """The admin endpoint's scraper must get through IPAddressAllow; the unit says so,
    and chooses a log format ``raftlease node`` accepts (--log-format's envvar)."""
    from raftlease.server.logs import LOG_FORMATS

    text = UNIT.read_text()
    assert "admin_address" in text and "/metrics" in text and "IPAddressAllow" in text
    service = _service()
    env = dict(item.partition("=")[::2] for item in service["Environment"])
    assert env["RAFTLEASE_LOG_FORMAT"] in LOG_FORMATS
    assert "localhost" in service["IPAddressAllow"][0].split()
