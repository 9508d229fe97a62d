"""A private etcd cluster on loopback for the demo, tests and benches: N members of Debian's `etcd`.

Free ports, data dirs under a folder of ours, each member started in the foreground so the PID we keep is
etcd's own, stopped by that PID. A member can be stopped and started again on the same data dir and ports
(quorum lost and back), or paused with SIGSTOP (a member that hangs with its connections open).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path
import shutil
import tempfile
import time

from sim.ports import free_port

_START_ATTEMPTS = 3


def etcd_binary() -> str | None:
    return shutil.which("etcd") or next((p for p in ("/usr/bin/etcd", "/usr/sbin/etcd") if os.path.exists(p)), None)


def _log_tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


class EtcdMember:
    def __init__(self, name: str, base: Path, client_port: int, peer_port: int, cluster: str, binary: str):
        self.name = name
        self.dir = base / name
        self.client_port = client_port
        self.peer_port = peer_port
        self.cluster = cluster
        self.binary = binary
        self.proc: subprocess.Popen | None = None
        self.started_once = False
        self.data_dir = self.dir / "data"
        self.metrics_port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        argv = [self.binary, "--name", self.name, "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
                "--initial-cluster", self.cluster, "--initial-cluster-state", "new",
                "--initial-cluster-token", "supernode-test",
                # a loaded 2-core test machine: raft heartbeats must not time out under load
                "--heartbeat-interval", "100", "--election-timeout", "1000",
                "--listen-metrics-urls", f"http://127.0.0.1:{self.metrics_port}", "--log-level", "warn"]
        log = open(self.dir / "etcd.log", "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        log.close()
        self.started_once = True

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)


class EtcdCluster:
    def __init__(self, base: Path, members: int = 3, binary: str | None = None, memory: bool = False):
        """`memory`: data dirs on tmpfs (/dev/shm), removed at stop: etcd fsyncs its WAL on every write, and on a
        disk shared with other work those fsyncs, not etcd, would set every request's latency."""
        binary = binary or etcd_binary()
        if binary is None:
            raise FileNotFoundError("etcd is not installed (Debian: apt-get install etcd-server)")
        self._base, self._size, self._binary = base, members, binary
        self._shm: Path | None = None
        if memory and Path("/dev/shm").is_dir():
            self._shm = Path(tempfile.mkdtemp(prefix="supernode-etcd-", dir="/dev/shm"))
        self.members = self._new_members()

    def _new_members(self) -> list[EtcdMember]:
        """Members on fresh ports and empty data dirs (a first start that failed leaves nothing behind)."""
        ports = [(free_port(), free_port()) for _ in range(self._size)]
        names = [f"m{i + 1}" for i in range(self._size)]
        cluster = ",".join(f"{n}=http://127.0.0.1:{p}" for n, (_, p) in zip(names, ports))
        members = [EtcdMember(n, self._base, c, p, cluster, self._binary) for n, (c, p) in zip(names, ports)]
        for m in members:
            if self._shm is not None:
                m.data_dir = self._shm / m.name
            shutil.rmtree(m.data_dir, ignore_errors=True)
        return members

    @property
    def endpoints(self) -> list[str]:
        return [m.url for m in self.members]

    def start(self) -> "EtcdCluster":
        """Start a new cluster. A member that exits before the cluster first answers (a port some other process
        took in the meantime) gets the whole cluster started again on fresh ports, up to three times; what
        each failed member logged is in the error."""
        failures: list[str] = []
        for attempt in range(_START_ATTEMPTS):
            if attempt:
                self.members = self._new_members()
            for m in self.members:
                m.start()
            problem = self._wait_healthy(deadline=time.monotonic() + 60)
            if problem is None:
                return self
            failures.append(problem)
            for m in self.members:
                m.stop()
        self.stop()
        raise RuntimeError(f"etcd did not become healthy in {_START_ATTEMPTS} tries: " + "; ".join(failures))

    def _wait_healthy(self, deadline: float) -> str | None:
        """None once every member answers; otherwise what went wrong, naming the member and its log."""
        while not self.healthy():
            dead = [m for m in self.members if not m.running()]
            if dead:
                return ", ".join(f"{m.name} exited ({m.dir / 'etcd.log'}: {_log_tail(m.dir / 'etcd.log')})"
                                 for m in dead)
            if time.monotonic() > deadline:
                return f"no answer within 60 s (see {self.members[0].dir / 'etcd.log'})"
            time.sleep(0.2)
        return None

    @staticmethod
    def _range(member: EtcdMember, key: bytes) -> list[dict]:
        """One key's kvs from one member's JSON gateway; OSError when it does not answer 200."""
        body = json.dumps({"key": base64.b64encode(key).decode()}).encode()
        req = urllib.request.Request(member.url + "/v3/kv/range", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=2) as resp:
            return json.load(resp).get("kvs") or []

    def healthy(self, member: EtcdMember | None = None) -> bool:
        for m in [member] if member else self.members:
            try:
                self._range(m, b"\0")
            except (OSError, ValueError):
                return False
        return True

    def get(self, key: str) -> bytes | None:
        """A key's value read from the first member that answers (tests check what agents wrote), or None."""
        for m in self.members:
            try:
                kvs = self._range(m, key.encode())
            except (OSError, ValueError):
                continue
            return base64.b64decode(kvs[0]["value"]) if kvs else None
        return None

    def _call(self, path: str, body: dict) -> dict:
        """One JSON-gateway call on the first member that answers (what a test or an attacker writes directly)."""
        data = json.dumps(body).encode()
        errors = []
        for m in self.members:
            req = urllib.request.Request(f"{m.url}/v3/{path}", data=data, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=2) as resp:
                    return json.load(resp)
            except (OSError, ValueError) as exc:
                errors.append(f"{m.name}: {exc}")
        raise OSError("no etcd member answered: " + "; ".join(errors))

    def put(self, key: str, value: bytes | str, lease: int = 0) -> int:
        """Write one key directly (not through an agent); the revision it got."""
        raw = value.encode() if isinstance(value, str) else value
        body = {"key": base64.b64encode(key.encode()).decode(), "value": base64.b64encode(raw).decode()}
        if lease:
            body["lease"] = str(lease)
        return int(self._call("kv/put", body)["header"]["revision"])

    def delete(self, key: str) -> None:
        self._call("kv/deleterange", {"key": base64.b64encode(key.encode()).decode()})

    def lease_grant(self, ttl: int) -> int:
        return int(self._call("lease/grant", {"TTL": str(ttl)})["ID"])

    def lease_of(self, key: str) -> int:
        """The lease a key is held under (0: none, or no such key)."""
        for m in self.members:
            try:
                kvs = self._range(m, key.encode())
            except (OSError, ValueError):
                continue
            return int(kvs[0].get("lease", 0)) if kvs else 0
        return 0

    def stop(self) -> None:
        for m in self.members:
            m.stop()
        if self._shm is not None:
            shutil.rmtree(self._shm, ignore_errors=True)
