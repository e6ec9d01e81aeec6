"""etcd (Debian ``etcd-server``, v3.4) as an anchor: a 3-member cluster on 127.0.0.1
driven through its v3 HTTP/JSON gateway (base64 keys), so no gRPC library is needed.

The mapping of the workloads (docs in /work/shared/ANCHORS.md and the README):
acquire = ``Txn(If create_revision(key) == 0 Then Put(key, owner, lease))`` with one
lease per client ("session style", granted when the client connects); renew =
``LeaseKeepAlive`` (leader memory only, no log write); release = ``DeleteRange(key)``;
read holder = ``Range`` linearizable (ReadIndex) or serializable; handoff = the
``concurrency.Mutex`` recipe (a key per waiter under the lock prefix, wait on the
predecessor's delete through a watch).

An ``EtcdClient`` is one HTTP/1.1 keep-alive connection; it is used by one thread.
Every call blocks for at most its timeout and raises AnchorError on failure.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import shutil
from pathlib import Path
from typing import Any

from .common import AnchorCluster, AnchorError, Driver, ServerProc, free_ports

#: The server binary (a name on PATH; tests point it elsewhere).
ETCD = "etcd"

#: TTL of the per-client session lease and the renew pool's leases, seconds. Long
#: enough to outlive the whole phase without a background keep-alive (clientv3's
#: session would run one; its cost is not what is measured): a lease's cost in etcd
#: does not depend on its TTL.
SESSION_TTL = 3600


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def installed() -> str | None:
    """None if etcd can run here, else why not (for the skip message)."""
    if shutil.which(ETCD) is None:
        return f"{ETCD} not found on PATH (Debian: apt-get install etcd-server)"
    return None


def command(name: str, data_dir: Path, client_port: int, peer_port: int, cluster: str) -> list[str]:
    """The command line of one member (default settings: WAL fsync on)."""
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        ETCD,
        "--name",
        name,
        "--data-dir",
        str(data_dir),
        "--listen-client-urls",
        client,
        "--advertise-client-urls",
        client,
        "--listen-peer-urls",
        peer,
        "--initial-advertise-peer-urls",
        peer,
        "--initial-cluster",
        cluster,
        "--initial-cluster-state",
        "new",
        "--initial-cluster-token",
        "raftlease-bench",
    ]


def initial_cluster(names: list[str], peer_ports: list[int]) -> str:
    return ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, peer_ports, strict=True))


def acquire_txn(key: str, owner: str, lease: str) -> dict[str, Any]:
    """The body of an exclusive acquire: put ``key`` only if it does not exist."""
    return {
        "compare": [
            {"key": b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}
        ],
        "success": [{"request_put": {"key": b64(key), "value": b64(owner), "lease": lease}}],
    }


def parse_status(reply: dict[str, Any]) -> tuple[str, str]:
    """(member_id, leader_id) from a /v3/maintenance/status reply ("0" = no leader)."""
    return str(reply["header"]["member_id"]), str(reply.get("leader", "0"))


class EtcdClient:
    """One keep-alive HTTP connection to one member's gateway (one thread's)."""

    def __init__(self, ports: list[int], timeout: float = 5.0) -> None:
        self.ports = ports
        self.timeout = timeout
        self._at = 0
        self._conn: http.client.HTTPConnection | None = None
        self.lease = ""
        #: Keys and leases of this client for renew/reads, and keys to release
        #: (set by run.py).
        self.pool: list[str] = []
        self.leases: list[str] = []
        self.release_pool: list[str] = []

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def next_endpoint(self) -> None:
        """Drop the connection; the next call goes to the next member."""
        self.close()
        self._at = (self._at + 1) % len(self.ports)

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to /v3/``path`` and return the JSON reply (the first
        message of a streaming reply). AnchorError on any failure; the connection
        is dropped then, so the next call reconnects."""
        if self._conn is None:
            self._conn = http.client.HTTPConnection(
                "127.0.0.1", self.ports[self._at], timeout=self.timeout
            )
        data = json.dumps(body).encode()
        try:
            self._conn.request("POST", "/v3/" + path, data, {"Content-Type": "application/json"})
            resp = self._conn.getresponse()
            raw = resp.readline() if path in STREAMING else resp.read()
            if path in STREAMING:
                resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise AnchorError(f"etcd {path}: {type(exc).__name__}: {exc}") from exc
        if resp.status != 200:
            self.close()
            raise AnchorError(f"etcd {path}: HTTP {resp.status}: {raw[:200]!r}")
        try:
            reply: dict[str, Any] = json.loads(raw)
        except ValueError as exc:
            raise AnchorError(f"etcd {path}: bad JSON {raw[:200]!r}") from exc
        if "error" in reply:
            raise AnchorError(f"etcd {path}: {reply['error']}")
        return reply.get("result", reply) if path in STREAMING else reply

    # ------------------------------------------------------------ operations

    def grant(self, ttl: int = SESSION_TTL) -> str:
        return str(self.call("lease/grant", {"TTL": ttl})["ID"])

    def acquire(self, key: str, owner: str = "bench-agent") -> int:
        """Exclusive put on ``key`` under this client's session lease; returns the
        revision (the fencing token). AnchorError if the key exists."""
        reply = self.call("kv/txn", acquire_txn(key, owner, self.lease))
        if not reply.get("succeeded"):
            raise AnchorError(f"etcd acquire {key}: held")
        return int(reply["header"]["revision"])

    def keepalive(self, lease: str) -> None:
        reply = self.call("lease/keepalive", {"ID": lease})
        if int(reply.get("TTL", 0)) <= 0:
            raise AnchorError(f"etcd keepalive {lease}: lease gone")

    def release(self, key: str) -> None:
        self.call("kv/deleterange", {"key": b64(key)})

    def read(self, key: str, serializable: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"key": b64(key)}
        if serializable:
            body["serializable"] = True
        return self.call("kv/range", body)

    def wait_deleted(self, key: str, revision: int, timeout: float = 30.0) -> None:
        """Block until ``key`` is deleted at a revision after ``revision`` (a watch
        stream on its own connection, closed once the event came)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.ports[self._at], timeout=timeout)
        body = {"create_request": {"key": b64(key), "start_revision": str(revision + 1)}}
        try:
            conn.request("POST", "/v3/watch", json.dumps(body).encode())
            resp = conn.getresponse()
            while True:
                line = resp.readline()
                if not line:
                    raise AnchorError("etcd watch: stream ended")
                events = json.loads(line).get("result", {}).get("events", [])
                if any(e.get("type") == "DELETE" for e in events):
                    return
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise AnchorError(f"etcd watch: {type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()

    def lock(self, prefix: str) -> str:
        """The concurrency.Mutex recipe: own key ``prefix/<lease hex>``; wait for
        the delete of the latest key created before it; return the own key."""
        mine = f"{prefix}/{int(self.lease):x}"
        reply = self.call("kv/txn", acquire_txn(mine, "waiter", self.lease))
        my_rev = int(reply["header"]["revision"])
        while True:
            # The newest waiter created before us (create_revision < my_rev).
            prior = self.call(
                "kv/range",
                {
                    "key": b64(prefix + "/"),
                    "range_end": b64(prefix + "0"),  # '0' follows '/'
                    "sort_order": "DESCEND",
                    "sort_target": "CREATE",
                    "max_create_revision": str(my_rev - 1),
                    "limit": "1",
                },
            )
            kvs = prior.get("kvs", [])
            if not kvs:
                return mine
            pred = base64.b64decode(kvs[0]["key"]).decode()
            self.wait_deleted(pred, int(prior["header"]["revision"]))


#: Gateway paths whose reply is a stream (the first message is the answer).
STREAMING = ("lease/keepalive",)


class EtcdCluster(AnchorCluster):
    """Three etcd members; data dirs under ``base``."""

    name = "etcd"

    def __init__(self, base: Path, size: int = 3) -> None:
        super().__init__(base, size)
        ports = free_ports(2 * size)
        self.client_ports = ports[:size]
        self.peer_ports = ports[size:]
        names = [f"etcd{i + 1}" for i in range(size)]
        spec = initial_cluster(names, self.peer_ports)
        for name, cport, pport in zip(names, self.client_ports, self.peer_ports, strict=True):
            self.servers[name] = ServerProc(
                name,
                command(name, base / name, cport, pport, spec),
                base / f"{name}.log",
                base,
            )
        self._port_of = dict(zip(names, self.client_ports, strict=True))

    def status(self, name: str) -> tuple[str, str]:
        c = EtcdClient([self._port_of[name]], timeout=1.0)
        try:
            return parse_status(c.call("maintenance/status", {}))
        finally:
            c.close()

    def leader(self) -> str | None:
        ids: dict[str, str] = {}
        leaders: set[str] = set()
        for name, server in self.servers.items():
            if not server.alive():
                continue
            with contextlib.suppress(AnchorError):
                member, lead = self.status(name)
                ids[member] = name
                leaders.add(lead)
        for lead in leaders:
            if lead in ids:
                return ids[lead]
        return None

    def all_serving(self) -> bool:
        for name, server in self.servers.items():
            if server.alive():
                self.status(name)
        return True

    def leader_port(self) -> int:
        leader = self.leader()
        if leader is None:
            raise AnchorError("etcd: no leader")
        return self._port_of[leader]

    def ports_leader_first(self) -> list[int]:
        first = self.leader_port()
        return [first] + [p for p in self.client_ports if p != first]


class EtcdDriver(Driver[EtcdClient]):
    """Clients connect to the leader first (as raftlease's do) and hold one
    session lease each."""

    def __init__(self, cluster: EtcdCluster, timeout: float = 5.0) -> None:
        self.cluster = cluster
        self.timeout = timeout

    def connect(self) -> EtcdClient:
        client = EtcdClient(self.cluster.ports_leader_first(), self.timeout)
        client.lease = client.grant()
        return client

    def close(self, client: EtcdClient) -> None:
        with contextlib.suppress(AnchorError):
            client.call("lease/revoke", {"ID": client.lease})
        client.close()
