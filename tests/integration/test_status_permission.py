"""One permission for every status surface (issue 37): with an auth file, ``/status``
needed an admin token while ``/v1/status`` and the native ``status`` answered 41
fields to anyone. Now all three show everything only to ``admin``; the native and
``/v1`` surfaces show anyone else the fields of leader discovery and health."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raftlease.protocol import FrameDecoder, encode_frame
from raftlease.server.auth import STATUS_OPEN_FIELDS
from raftlease.testing import wait_for
from raftlease.testing.certs import agent_role, secure_bundle
from tests.integration.test_admin_http import admin_cluster, admin_of, get

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

AGENT = "agent-token-without-admin-0123456"


def _native_status(addr: str, context: ssl.SSLContext, token: str | None) -> dict[str, Any]:
    host, _, port = addr.rpartition(":")
    with context.wrap_socket(
        socket.create_connection((host, int(port)), timeout=30), server_hostname=host
    ) as sock:
        frames = [encode_frame({"id": 1, "op": "auth", "token": token})] if token else []
        sock.sendall(b"".join([*frames, encode_frame({"id": 2, "op": "status"})]))
        decoder = FrameDecoder()
        while True:
            data = sock.recv(65536)
            assert data, "closed"
            for frame in decoder.feed(data):
                if frame.get("id") == 2:
                    assert frame["ok"] is True, frame
                    return dict(frame["result"])


def test_every_status_surface_shows_everything_only_to_an_admin(tmp_path: Path) -> None:
    bundle = secure_bundle(tmp_path / "tls")
    bundle.auth_file.write_text(bundle.auth_file.read_text() + agent_role({"agent-7": AGENT}))
    cluster = admin_cluster(1, **bundle.node_settings())
    cluster.start()
    try:
        context = ssl.create_default_context(cafile=str(bundle.ca_file))
        admin = admin_of(cluster, "n1")
        client = cluster.nodes[0].client

        def https(path: str, token: str | None) -> tuple[int, Any]:
            headers = {"Authorization": f"Bearer {token}"} if token else None
            code, _, body = get(admin, path, headers=headers, scheme="https", context=context)
            return code, json.loads(body) if code == 200 else None

        wait_for(lambda: https("/readyz", None)[0] == 200, 30, "ready")
        full = _native_status(client, context, bundle.admin_token)
        assert {"term", "applied_index", "peer_tls", "clients"} <= set(full)
        assert len(full) > 20
        for token in (None, AGENT):
            assert set(_native_status(client, context, token)) == STATUS_OPEN_FIELDS
            code, body = https("/v1/status", token)
            assert code == 200 and set(body) == STATUS_OPEN_FIELDS, body
        assert https("/status", None)[0] == 401
        assert https("/status", AGENT)[0] == 403
        code, body = https("/v1/status", bundle.admin_token)
        assert code == 200 and "term" in body
        assert https("/status", bundle.admin_token)[0] == 200
        # The harness reads terms with the bundle's admin token.
        assert "term" in cluster.node_status("n1")
        # `raftlease status` without an admin token shows what it may, and says so.
        env = {**os.environ, "RAFTLEASE_CA_FILE": str(bundle.ca_file)}
        env.pop("RAFTLEASE_TOKEN", None)
        env.pop("RAFTLEASE_AUTH_TOKEN", None)
        out = subprocess.run(
            [sys.executable, "-m", "raftlease", "status", "--endpoints", client],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "shown with an admin token only" in out.stdout, out.stdout
    finally:
        cluster.close()
