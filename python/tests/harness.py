"""A live pool for the tests: an ``rbgctl master`` and stores as real processes on loopback.

The binary is ``$RBGCTL_BIN``, else ``target/debug/rbgctl`` of the repository. Every wait is
bounded; every process is killed when the pool closes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Callable, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def binary() -> str:
    path = os.environ.get("RBGCTL_BIN") or os.path.join(REPO, "target", "debug", "rbgctl")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is not there: build it with `cargo build` or set RBGCTL_BIN")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout} s")


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Store:
    def __init__(
        self, pool: "LivePool", segment: str, persistent: bool, shm_dir: str, disk_tier: Optional[str] = None
    ):
        self.pool = pool
        self.segment = segment
        self.persistent = persistent
        self.shm_dir = shm_dir
        # A disk tier of this size, in a directory on a real filesystem (O_DIRECT needs one).
        self.disk_tier = disk_tier
        self.disk_dir = tempfile.mkdtemp(prefix="rbgctl-pytest-disk-") if disk_tier else None
        self.port = free_port()
        self.metrics_port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        self.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                binary(),
                "store",
                "--master",
                self.pool.master,
                "--bind-address",
                "127.0.0.1",
                "--local-hostname",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--segment-size",
                self.segment,
                "--persistent",
                "true" if self.persistent else "false",
                "--metrics-host",
                "127.0.0.1",
                "--metrics-port",
                str(self.metrics_port),
                "--heartbeat-interval",
                "200ms",
                "--shm-dir",
                self.shm_dir,
                *self.disk_args(),
                *self.pool.auth_args(),
                *(["--metadata-server", self.pool.metadata_url] if self.pool.metadata_url else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.pool.log,
        )

    def disk_args(self) -> List[str]:
        if not self.disk_tier:
            return []
        name = f"store-{self.port}"
        return ["--name", name, "--disk-tier", self.disk_dir, "--disk-tier-size", self.disk_tier]

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


class LivePool:
    """``with LivePool(stores=2) as pool: Client(pool.master)``"""

    def __init__(
        self,
        stores: int = 1,
        segment: str = "256MiB",
        persistent: bool = False,
        master_args=(),
        disk_tier: Optional[str] = None,
        auth_token_file: Optional[str] = None,
        metadata_port: Optional[int] = None,
    ):
        # Every role holds this cluster secret, and so do the harness's own clients.
        self.auth_token_file = auth_token_file
        # With a port: the master serves Mooncake's HTTP metadata server there, and the stores
        # publish their Transfer Engine descriptors to it.
        self.metadata_url = f"http://127.0.0.1:{metadata_port}/metadata" if metadata_port else None
        if metadata_port:
            master_args = (
                "--enable-http-metadata-server", "true",
                "--http-metadata-server-host", "127.0.0.1",
                "--http-metadata-server-port", str(metadata_port),
                *master_args,
            )
        self.rpc_port = free_port()
        self.master = f"127.0.0.1:{self.rpc_port}"
        self.metrics_port = free_port()
        self.dir = tempfile.mkdtemp(
            prefix="rbgctl-pytest-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
        self.log = open(os.path.join(self.dir, "processes.log"), "ab")
        self.master_proc = subprocess.Popen(
            [
                binary(),
                "master",
                "--rpc-address",
                "127.0.0.1",
                "--rpc-port",
                str(self.rpc_port),
                "--metrics-host",
                "127.0.0.1",
                "--metrics-port",
                str(self.metrics_port),
                *self.auth_args(),
                *master_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        self.stores: List[Store] = []
        try:
            wait_until("master listening", lambda: port_open(self.rpc_port))
            for i in range(stores):
                self.stores.append(
                    Store(self, segment, persistent, os.path.join(self.dir, f"store{i}"), disk_tier)
                )
            # A store with a disk tier mounts two segments.
            self.wait_segments(stores * (2 if disk_tier else 1))
        except BaseException:
            self.close()
            raise

    def auth_args(self) -> List[str]:
        return ["--auth-token-file", self.auth_token_file] if self.auth_token_file else []

    def segments(self):
        from rbgctl.client import Client
        from rbgctl.config import ClientConfig

        with Client(ClientConfig(master=self.master, auth_token_file=self.auth_token_file)) as c:
            return c.segments()

    def wait_segments(self, n: int) -> None:
        wait_until(f"{n} segment(s) mounted", lambda: len(self.segments()) == n, timeout=30)

    def master_metric(self, name: str) -> Optional[float]:
        """The first sample of a master metric, or None."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return None

    def close(self) -> None:
        for s in self.stores:
            s.kill9()
            if s.disk_dir:
                shutil.rmtree(s.disk_dir, ignore_errors=True)
        if self.master_proc.poll() is None:
            self.master_proc.send_signal(signal.SIGKILL)
            self.master_proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LivePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
