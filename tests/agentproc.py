"""Start a real agent process for tests and stop it by its PID."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from agent.memory import daemon_env
from tests.helpers import REPO, free_port, wait_for


class AgentUnreachable(AssertionError):
    """The agent gave no HTTP answer (connection refused or reset, timeout). Raised, never turned into a status:
    a test that asserts "not 200" or "nothing there" must not pass because the agent is down."""


class AgentProcess:
    running: "set[AgentProcess]" = set()  # started and not stopped: their logs go with a failing test's report
    stopped: "list[AgentProcess]" = []  # stopped during the current test (tests/conftest.py clears it): theirs too

    def __init__(self, config: dict[str, Any], workdir: Path, env: dict[str, str] | None = None,
                 preexec: Callable[[], None] | None = None):
        self.preexec = preexec  # run in the child before exec (e.g. a lower RLIMIT_NOFILE)
        self.workdir = workdir
        self.config = config
        self.port = config["listen"]["port"]
        self.config_path = workdir / "agent.yaml"
        self.log_path = workdir / "agent.log"
        self.env = env or {}
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_config(self, config: dict[str, Any] | str) -> None:
        text = config if isinstance(config, str) else yaml.safe_dump(config)
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.config_path)

    def start(self) -> "AgentProcess":
        self.write_config(self.config)
        env = {**daemon_env(), "PYTHONUNBUFFERED": "1", **self.env}  # as the systemd unit runs it
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "--config", str(self.config_path), "run"],
                                     stdout=self._log, stderr=self._log, env=env, cwd=REPO,
                                     preexec_fn=self.preexec)
        AgentProcess.running.add(self)
        try:
            wait_for(lambda: self.healthy() or self.proc.poll() is not None, 20, what="agent /healthz")
            assert self.proc.poll() is None, f"agent exited: {self.log()}"
        except BaseException:
            self.stop()  # a start that failed must not leave the process running (and loading the host) for good
            raise
        return self

    def healthy(self) -> bool:
        """Whether /healthz answers 200 now; an agent still starting (no answer yet) is not healthy."""
        try:
            return self.get("/healthz")[0] == 200
        except AgentUnreachable:
            return False

    def get(self, path: str, token: str | None = None) -> tuple[int, bytes]:
        return self.request("GET", path, token=token)

    def request(self, method: str, path: str, body: Any = None, token: str | None = None,
                raw: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(status, body) of a real HTTP answer, whatever its status; AgentUnreachable when there is none."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except OSError as exc:  # refused, reset, timed out: no answer at all
            raise AgentUnreachable(f"{method} {self.url}{path}: no answer ({exc})") from exc

    def metrics(self) -> str:
        status, body = self.get("/metrics")
        assert status == 200, status
        return body.decode()

    def state(self) -> dict[str, Any]:
        status, body = self.get("/api/v1/state")
        assert status == 200
        return json.loads(body)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def log_tail(self, lines: int = 40, width: int = 400) -> str:
        """The last `lines` lines of the agent's log, each cut at `width`: what a failing test's report shows."""
        return "\n".join(line[:width] for line in self.log().splitlines()[-lines:])

    def stop(self) -> int | None:
        if self in AgentProcess.running:
            AgentProcess.running.discard(self)
            AgentProcess.stopped.append(self)
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode


def base_config(tmp_path: Path, token: str = "admin-token-for-tests", **sections: Any) -> dict[str, Any]:
    (tmp_path / "admin.token").write_text(token + "\n")
    cfg: dict[str, Any] = {
        "agent": {"rack": "r01", "node": "node01", "state_dir": str(tmp_path / "state")},
        "listen": {"address": "127.0.0.1", "port": free_port()},
        "secrets": {"admin_token": {"file": str(tmp_path / "admin.token")}},
        "sources": {"nvml": {"enabled": False}},
    }
    cfg.update(sections)
    return cfg


@contextmanager
def running_agent(config: dict[str, Any], workdir: Path, env: dict[str, str] | None = None,
                  preexec: Callable[[], None] | None = None) -> Iterator[AgentProcess]:
    agent = AgentProcess(config, workdir, env, preexec).start()
    try:
        yield agent
    finally:
        agent.stop()


def metric(agent: "AgentProcess", name: str, **labels: str) -> float | None:
    """The value of the series `name` with exactly these labels on the agent's /metrics, or None."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    m = re.search(rf"^{name}\{{{re.escape(want)}\}} (\S+)$", agent.metrics(), re.M)
    return float(m.group(1)) if m else None


def series_value(text: str, family: str, **labels: str) -> float | None:
    """The value of the first series of `family` in an exposition `text` whose labels include `labels` (the others
    may be anything; a series without labels matches no label asked for), or None."""
    for m in re.finditer(rf"^{family}(?:\{{([^}}]*)\}})? (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group(2))
    return None


def incidents(agent: "AgentProcess", token: str) -> dict[str, Any]:
    """GET /api/v1/incidents with an admin token: open, recent, pending approvals."""
    status, body = agent.get("/api/v1/incidents", token=token)
    assert status == 200, body
    return json.loads(body)

