# raftlease node image: one `raftlease node` per container, configured by a TOML file.
# Build:  docker build -t raftlease .
# Run a 3-node cluster: docker compose up (docker-compose.yml; cluster/README.md).
FROM python:3.11-slim

# No .pyc writes into the image at run time, unbuffered logs for `docker logs`.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY raftlease ./raftlease
RUN pip install . && rm -rf /src

# A fixed non-root user. The data directory, the certificates' directory and the
# CA's directory belong to it, so named volumes mounted there start with its
# ownership (Docker copies the image directory's owner and mode into a new volume).
# (Kubernetes: runAsUser/fsGroup 10001 in cluster/kubernetes/raftlease.yaml.)
RUN groupadd --system --gid 10001 raftlease \
    && useradd --system --uid 10001 --gid raftlease --home-dir /var/lib/raftlease \
       --shell /usr/sbin/nologin raftlease \
    && mkdir -p /var/lib/raftlease /var/lib/raftlease-ca /etc/raftlease/certs \
    && chown raftlease:raftlease /var/lib/raftlease /var/lib/raftlease-ca /etc/raftlease/certs \
    && chmod 0700 /var/lib/raftlease /var/lib/raftlease-ca /etc/raftlease/certs
USER raftlease:raftlease
WORKDIR /var/lib/raftlease

# The node's journal and snapshot (data_dir in the config): keep it on a volume.
VOLUME ["/var/lib/raftlease"]

# Client port, Raft port, admin HTTP endpoint (as in cluster/docker/*.toml).
EXPOSE 7001 7101 9001

# Liveness from the admin endpoint (admin_address = "0.0.0.0:9001" in the configs).
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9001/livez', timeout=2)"]

# SIGTERM (docker stop) is a clean stop: the node closes its journal and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["raftlease", "node"]
CMD ["--config", "/etc/raftlease/node.toml"]
