"""A private etcd cluster on loopback for the demo, tests and benches: N members of Debian's `etcd`.

Free ports, data dirs under a folder of ours, each member started in the foreground so the PID we keep is
etcd's own, stopped by that PID. A member can be stopped and started again on the same data dir and ports
(quorum lost and back), or paused with SIGSTOP (a member that hangs with its connections open).

It runs as a production rack's etcd should (docs/deployment.md): clients over TLS (a certificate of the
run's own CA, agent/sim/redfish/pki.py) and auth enabled, with one user and role per node made from the
same plan as `supernode-agent coordination etcd-roles` (agent.coordination.etcd_auth; `authorize` gives
an agent's config its node's credentials). The direct helpers (`put`, `delete`, `lease_grant`, `get`, ...)
act as etcd's root: what a test writes with them is what an attacker holding root of etcd could write.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
import shutil
import tempfile
import time
from typing import Any, ClassVar

from agent.coordination.etcd_auth import gateway_requests, rack_roles
from sim.ports import free_port

_START_ATTEMPTS = 3
ADMIN_TIMEOUT = 15.0  # seconds for a user, role or auth call (see EtcdCluster._first)


def etcd_binary() -> str | None:
    return shutil.which("etcd") or next((p for p in ("/usr/bin/etcd", "/usr/sbin/etcd") if os.path.exists(p)), None)


def _log_tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


class EtcdMember:
    def __init__(self, name: str, base: Path, client_port: int, peer_port: int, cluster: str, binary: str,
                 extra: list[str] | None = None):
        self.name = name
        self.extra = list(extra or [])  # TLS files, auth token TTL
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
        scheme = "https" if "--cert-file" in self.extra else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

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
                "--listen-metrics-urls", f"http://127.0.0.1:{self.metrics_port}", "--log-level", "warn", *self.extra]
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
    _serving: ClassVar[dict[str, "EtcdCluster"]] = {}  # client URL -> the running cluster it belongs to

    def __init__(self, base: Path, members: int = 3, binary: str | None = None, memory: bool = False,
                 auth: bool = True, tls: bool = True, token_ttl: int | None = None):
        """`memory`: data dirs on tmpfs (/dev/shm), removed at stop: etcd fsyncs its WAL on every write, and on a
        disk shared with other work those fsyncs, not etcd, would set every request's latency.
        `auth`, `tls`: as in production (see the module docstring); `token_ttl`: etcd's --auth-token-ttl
        (seconds an idle token lives; default etcd's 300)."""
        binary = binary or etcd_binary()
        if binary is None:
            raise FileNotFoundError("etcd is not installed (Debian: apt-get install etcd-server)")
        self._base, self._size, self._binary = base, members, binary
        self._shm: Path | None = None
        if memory and Path("/dev/shm").is_dir():
            self._shm = Path(tempfile.mkdtemp(prefix="supernode-etcd-", dir="/dev/shm"))
        self.auth = auth
        self.ca_file: Path | None = None
        self._ssl: ssl.SSLContext | None = None
        self._extra: list[str] = []
        if tls:
            from sim.redfish.pki import SimCA

            ca = SimCA(base / "pki", "supernode-agent test etcd CA")
            cert = ca.issue("etcd")
            self.ca_file = ca.ca_file
            self._ssl = ssl.create_default_context(cafile=str(ca.ca_file))
            self._extra += ["--cert-file", str(cert.cert_file), "--key-file", str(cert.key_file)]
        if token_ttl is not None:
            self._extra += ["--auth-token-ttl", str(token_ttl)]
        self.root_password = secrets.token_urlsafe(18)
        base.mkdir(parents=True, exist_ok=True)
        self.root_password_file = base / "root.password"  # for a person's etcdctl (ETCDCTL_PASSWORD) in the demo
        fd = os.open(self.root_password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.root_password + "\n")
        self._token: str | None = None
        self.passwords: dict[str, str] = {}  # etcd user -> its password (the node users made by `authorize`)
        self.members = self._new_members()

    def _new_members(self) -> list[EtcdMember]:
        """Members on fresh ports and empty data dirs (a first start that failed leaves nothing behind)."""
        ports = [(free_port(), free_port()) for _ in range(self._size)]
        names = [f"m{i + 1}" for i in range(self._size)]
        cluster = ",".join(f"{n}=http://127.0.0.1:{p}" for n, (_, p) in zip(names, ports))
        members = [EtcdMember(n, self._base, c, p, cluster, self._binary, self._extra)
                   for n, (c, p) in zip(names, ports)]
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
                if self.auth:
                    self._enable_auth()
                for url in self.endpoints:
                    EtcdCluster._serving[url] = self
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

    def _open(self, member: EtcdMember, path: str, body: dict | None, token: str | None, timeout: float = 2.0) -> Any:
        """One request to one member (POST of `body`, or GET); its JSON answer. HTTPError (an etcd error,
        whose body names it) or OSError (no answer within `timeout`)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{member.url}/{path}", data=data, method="POST" if body is not None else "GET")
        if token:
            req.add_header("Authorization", token)
        with urllib.request.urlopen(req, timeout=timeout, context=self._ssl) as resp:
            return json.load(resp)

    def _root_token(self, fresh: bool = False) -> str | None:
        if not self.auth:
            return None
        if self._token is None or fresh:
            self._token = self._first("v3/auth/authenticate", {"name": "root", "password": self.root_password},
                                      None)["token"]
        return self._token

    def _first(self, path: str, body: dict, token: str | None, members: list[EtcdMember] | None = None) -> dict:
        """One call on the first member that answers; an etcd error is raised (OSError naming it).

        Given ADMIN_TIMEOUT: a user's password is hashed with bcrypt by etcd on `user/add` and on `authenticate`,
        which on a loaded 2-core machine (18 demo agents starting) took longer than the health probe's 2 s and
        failed the demo's start with "The read operation timed out"."""
        errors = []
        for m in members or self.members:
            try:
                return self._open(m, path, body, token, ADMIN_TIMEOUT)
            except urllib.error.HTTPError as exc:
                raise OSError(f"{m.name}: etcd {exc.code}: {exc.read()[:200]!r}") from None
            except (OSError, ValueError) as exc:
                errors.append(f"{m.name}: {exc}")
        raise OSError("no etcd member answered: " + "; ".join(errors))

    def _as_root(self, path: str, body: dict, members: list[EtcdMember] | None = None) -> dict:
        """A gateway call as root; a token etcd forgot (expired, a restarted member) is replaced once."""
        try:
            return self._first(path, body, self._root_token(), members)
        except OSError as exc:
            if "invalid auth token" not in str(exc):
                raise
        return self._first(path, body, self._root_token(fresh=True), members)

    def _enable_auth(self) -> None:
        """Root (with its root role, or etcd warns) and auth on: three calls, before any agent connects."""
        self._first("v3/auth/user/add", {"name": "root", "password": self.root_password}, None)
        self._first("v3/auth/user/grant", {"user": "root", "role": "root"}, None)
        self._first("v3/auth/enable", {}, None)
        self._token = None

    def authorize(self, cfg: dict[str, Any], workdir: Path) -> dict[str, Any]:
        """Point an agent config's `coordination.etcd` at this cluster as its node's own etcd user: endpoints,
        the CA, and (auth on) the node's user and role made here from the config's inventory (as
        `coordination etcd-roles` would), its password in a file of `workdir` (mode 0600) named in `secrets`."""
        from agent.config import Inventory

        etcd = cfg["coordination"]["etcd"]
        etcd["endpoints"] = self.endpoints
        if self.ca_file is not None:
            etcd["tls"] = {"ca_file": str(self.ca_file)}
        if not self.auth:
            return cfg
        node, rack = cfg["agent"]["node"], cfg["agent"]["rack"]
        inventory = Inventory.model_validate(cfg.get("inventory") or {})
        role = rack_roles(inventory, rack, etcd.get("prefix", "/supernode-agent"), [node])[0]
        new = role.name not in self.passwords
        password = self.passwords.setdefault(role.name, secrets.token_urlsafe(18))
        for path, body in gateway_requests(role, password):
            if new or path == "auth/role/grant":  # a second config of this node: only its (more) keys
                self._as_root(f"v3/{path}", body)
        workdir.mkdir(parents=True, exist_ok=True)
        pw_file = workdir / "etcd.password"
        fd = os.open(pw_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        cfg.setdefault("secrets", {})["etcd_password"] = {"file": str(pw_file)}
        etcd["password_secret"] = "etcd_password"
        etcd.pop("user", None)  # the default: <rack>.<node>, the user made above
        return cfg

    @classmethod
    def serving(cls, endpoints: list[str]) -> "EtcdCluster | None":
        """The running cluster of these client URLs (None: not one of ours)."""
        return next((cls._serving[u] for u in endpoints if u in cls._serving), None)

    def healthy(self, member: EtcdMember | None = None) -> bool:
        """Every member (or `member`) answers /health true: it has a leader and serves (no auth needed)."""
        for m in [member] if member else self.members:
            try:
                if self._open(m, "health", None, None).get("health") != "true":
                    return False
            except (OSError, ValueError):
                return False
        return True

    def _range(self, key: str) -> list[dict]:
        """One key's kvs, as root, from the first member that answers."""
        return self._as_root("v3/kv/range", {"key": base64.b64encode(key.encode()).decode()}).get("kvs") or []

    def get(self, key: str) -> bytes | None:
        """A key's value read from the first member that answers (tests check what agents wrote), or None."""
        try:
            kvs = self._range(key)
        except OSError:
            return None
        return base64.b64decode(kvs[0]["value"]) if kvs else None

    def _call(self, path: str, body: dict) -> dict:
        """One JSON-gateway call as root on the first member that answers (what a test or an attacker writes
        directly)."""
        return self._as_root(f"v3/{path}", body)

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
        try:
            kvs = self._range(key)
        except OSError:
            return 0
        return int(kvs[0].get("lease", 0)) if kvs else 0

    def stop(self) -> None:
        for url in self.endpoints:
            EtcdCluster._serving.pop(url, None)
        for m in self.members:
            m.stop()
        if self._shm is not None:
            shutil.rmtree(self._shm, ignore_errors=True)
