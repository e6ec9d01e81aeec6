"""Names and addresses of ``raftlease.testing.hosts``' hosts, and the /etc/hosts they
all see: pure bookkeeping (no root, no namespace), so that it is tested on its own."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence

#: The default subnet (private to each harness's switch, so never in conflict).
DEFAULT_SUBNET = "10.201.0.0/24"
#: Automatic addresses start here (lower ones are left for callers to pick).
FIRST_AUTO_HOST = 10
#: Lines of the hosts file before the first entry's (``hosts_file_text``).
HEADER_LINES = 3

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


def hosts_file_text(entries: Iterable[tuple[str, Sequence[str]]]) -> str:
    """An /etc/hosts: the loopback lines, then one ``address<TAB>names`` line per
    entry, in order."""
    lines = [
        "# written by raftlease.testing.hosts",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
    ]
    lines += [f"{address}\t{' '.join(names)}" for address, names in entries]
    return "\n".join(lines) + "\n"


class HostsTable:
    """Names and addresses of one network's hosts (pure bookkeeping, no root needed):
    hands out addresses, checks that names, aliases and addresses are valid and unique,
    and renders the /etc/hosts every host gets. Lines are only ever added, or commented
    out in place by their first byte (``remove``), so the file can change in place by
    appending lines (``line_for``) and writing single bytes (``offset``): a process
    reading it sees the old text or the new, never a torn one."""

    def __init__(self, subnet: str = DEFAULT_SUBNET) -> None:
        self.subnet = ipaddress.IPv4Network(subnet)
        if self.subnet.num_addresses < 4:
            raise ValueError(f"subnet {subnet} is too small")
        self.entries: list[tuple[str, tuple[str, ...]]] = []
        self.addresses: dict[str, str] = {}  # host name -> address
        self.removed: set[int] = set()  # indexes of entries commented out
        self._names: set[str] = {"localhost"}
        self._lines: dict[str, list[int]] = {}  # host name -> its entries' indexes

    def add(self, name: str, address: str | None = None, aliases: Sequence[str] = ()) -> str:
        """Record host ``name`` (with ``aliases``) at ``address`` (default: the first
        free one from ``.10``); returns the address. Raises ``ValueError`` for an
        invalid or taken name or address (and then records nothing)."""
        address = self.check(name, address, aliases)
        self.addresses[name] = address
        self._names.update([name, *aliases])
        self._lines[name] = [len(self.entries)]
        self.entries.append((address, (name, *aliases)))
        return address

    def remove(self, name: str) -> list[int]:
        """Forget host ``name``: its address, name and aliases are free again, and its
        entries are commented out (``text``). Returns those entries' indexes (for
        ``offset``). Raises ``KeyError`` for an unknown host."""
        indexes = self._lines.pop(name)
        del self.addresses[name]
        for index in indexes:
            self._names.difference_update(self.entries[index][1])
        self.removed.update(indexes)
        return indexes

    def offset(self, index: int) -> int:
        """Where entry ``index``'s line starts in ``text`` (the byte a removal turns
        into ``#``)."""
        if not 0 <= index < len(self.entries):
            raise IndexError(index)
        lines = self.text().splitlines(keepends=True)
        return sum(len(line) for line in lines[: HEADER_LINES + index])

    def check(self, name: str, address: str | None = None, aliases: Sequence[str] = ()) -> str:
        """What ``add`` would return, without recording anything."""
        if len(name) > 63:
            raise ValueError(f"host name {name!r} is longer than 63 characters")
        self._check_names([name, *aliases])
        if address is None:
            return self._free_address()
        ip = ipaddress.IPv4Address(address)
        if ip not in self.subnet or ip in (
            self.subnet.network_address,
            self.subnet.broadcast_address,
        ):
            raise ValueError(f"{address} is not a host address of {self.subnet}")
        if str(ip) in self.addresses.values():
            raise ValueError(f"address {address} is taken")
        return str(ip)

    def alias(self, name: str, aliases: Sequence[str]) -> tuple[str, tuple[str, ...]]:
        """More names for host ``name``; returns the entry (a line of its own)."""
        if name not in self.addresses:
            raise KeyError(name)
        self._check_names(aliases)
        self._names.update(aliases)
        entry = (self.addresses[name], tuple(aliases))
        self._lines[name].append(len(self.entries))
        self.entries.append(entry)
        return entry

    def text(self) -> str:
        lines = hosts_file_text(self.entries).splitlines(keepends=True)
        for index in self.removed:
            lines[HEADER_LINES + index] = "#" + lines[HEADER_LINES + index][1:]
        return "".join(lines)

    @staticmethod
    def line_for(entry: tuple[str, Sequence[str]]) -> str:
        return hosts_file_text([entry]).splitlines()[-1] + "\n"

    def _check_names(self, names: Sequence[str]) -> None:
        for name in names:
            if not _HOSTNAME.fullmatch(name) or len(name) > 253:
                raise ValueError(f"{name!r} is not a valid host name")
            if name in self._names or names.count(name) > 1:
                raise ValueError(f"host name {name!r} is taken")

    def _free_address(self) -> str:
        taken = set(self.addresses.values())
        hosts = list(self.subnet.hosts())
        for ip in hosts[FIRST_AUTO_HOST - 1 :] + hosts[: FIRST_AUTO_HOST - 1]:
            if str(ip) not in taken:
                return str(ip)
        raise ValueError(f"no free address left in {self.subnet}")
