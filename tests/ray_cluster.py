"""A real multi-node Ray cluster on this machine, for tests (`ray start --head` plus `ray start --address`).

Every node is started by its own `ray start` in a new session, with its own `--temp-dir`; the
daemons it launches (GCS, raylet, agents, workers) stay in that session, so `stop()` ends exactly
these processes, by id. It does not run `ray stop`: that kills every Ray process of the user on
the machine by name, including a developer's own cluster or the local Ray another pytest worker
is running (tests/test_ray.py).

Two Ray 2.x behaviours this works around:
- token authentication: a head node turns it on when ~/.ray/auth_token exists (left by any local
  `ray.init()`), but a joining node does not, and then fails with InvalidAuthToken. The cluster
  therefore sets RAY_AUTH_MODE=token with a private token file (RAY_AUTH_TOKEN_PATH) for every
  node and for every driver (`env`), and never reads or writes ~/.ray.
- `--node-ip-address 127.0.0.1` is replaced by the machine's routable address on Linux
  (ray._private.services.resolve_ip_for_localhost), so the nodes register under that address.
  The GCS listens on every interface; the driver may still be given 127.0.0.1:PORT.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = Path(sys.executable).parent / "ray"


def free_port() -> int:
    """A TCP port nothing listens on now (on loopback)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ClusterError(RuntimeError):
    """A node did not start, or the cluster did not come up in time; the message has its output."""


class RayCluster:
    """`nodes` Ray nodes of `cpus` CPUs each on this machine; use as a context manager."""

    def __init__(self, nodes: int = 2, cpus: int = 1, object_store_bytes: int = 100 * 2**20):
        self.nodes, self.cpus, self.object_store_bytes = nodes, cpus, object_store_bytes
        # Short path: Ray's Unix sockets live under it (108-byte limit; pytest's tmp_path is too long).
        self.root = Path(tempfile.mkdtemp(prefix="clb-ray-", dir="/tmp"))
        self.port = free_port()
        self.sessions: list[int] = []  # one per `ray start`: the session id of all its daemons
        token = self.root / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN_PATH": str(token), "OMP_NUM_THREADS": "1",
                    "MLFLOW_DISABLE_TELEMETRY": "true"}
        self.env.pop("RAY_ADDRESS", None)

    @property
    def address(self) -> str:
        """What a driver passes as --ray-address."""
        return f"127.0.0.1:{self.port}"

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self, timeout: float = 120.0) -> None:
        """Start the head, then the other nodes; return once every node's CPUs are in the cluster."""
        self._ray_start("head", ["--head", "--port", str(self.port), "--include-dashboard=false",
                                 "--dashboard-port", str(free_port()), "--ray-client-server-port", str(free_port())])
        for i in range(1, self.nodes):
            self._ray_start(f"node{i}", ["--address", self.address])
        self.wait_for(cpus=self.nodes * self.cpus, timeout=timeout)

    def _ray_start(self, name: str, args: list[str]) -> None:
        cmd = [str(RAY), "start", *args, "--node-ip-address", "127.0.0.1", "--num-cpus", str(self.cpus),
               "--num-gpus", "0", "--object-store-memory", str(self.object_store_bytes),
               "--dashboard-agent-listen-port", str(free_port()), "--temp-dir", str(self.root / name),
               "--disable-usage-stats"]
        proc = subprocess.Popen(cmd, env=self.env, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.sessions.append(proc.pid)
        try:
            out, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            raise ClusterError(f"`ray start` ({name}) did not return in 180 s:\n{out[-3000:]}") from None
        if proc.returncode != 0:
            raise ClusterError(f"`ray start` ({name}) exited with {proc.returncode}:\n{out[-3000:]}")

    def status(self) -> str:
        """`ray status` of the cluster."""
        done = subprocess.run([str(RAY), "status", "--address", self.address], env=self.env,
                              capture_output=True, text=True, timeout=120)
        return done.stdout + done.stderr

    def node_ids(self) -> list[str]:
        """Ids of the cluster's active nodes, from `ray status`."""
        active = self.status().split("Active:", 1)[-1].split("Pending:", 1)[0]
        return re.findall(r"node_([0-9a-f]{16,})", active)

    def total_cpus(self) -> float:
        """The cluster's CPUs as `ray status` counts them (0 when it does not answer yet)."""
        match = re.search(r"([\d.]+)/([\d.]+) CPU", self.status())
        return float(match.group(2)) if match else 0.0

    def wait_for(self, cpus: float, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            seen = self.total_cpus()
            if seen >= cpus:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"the cluster has {seen} CPUs after {timeout:.0f} s, expected {cpus}:\n"
                                   f"{self.status()[-3000:]}")
            time.sleep(1.0)

    def processes(self) -> list[int]:
        """Live (not zombie) processes of this cluster: in its sessions, or naming its temp dir."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                sid = os.getsid(pid)
            except (OSError, IndexError):
                continue  # gone meanwhile
            if state != "Z" and (sid in self.sessions or str(self.root) in cmdline):
                found.append(pid)
        return found

    def stop(self, grace: float = 2.0) -> None:
        """End this cluster's processes (SIGTERM, then SIGKILL after `grace` s, as `ray stop --force`
        would, but only these) and remove its files."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            pids = self.processes()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while pids and time.monotonic() < deadline:
                time.sleep(0.2)
                pids = self.processes()
            if not pids:
                break
        shutil.rmtree(self.root, ignore_errors=True)
