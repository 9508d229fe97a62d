"""Real Prometheus and Alertmanager peers for tests, bound to 127.0.0.1 on free ports.

Each peer runs from the Debian binary with the flags of RECIPES.md, is waited
on through `GET /-/ready` with a deadline, and is stopped by its own PID (never
by name: other helpers run the same binaries at the same time).

    with prometheus_server(tmp_path, scrape_configs=[...], rule_files=[...]) as prom:
        prom.query("up")
    with alertmanager_server(tmp_path, config_text) as am:
        ...
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

from tests.helpers import free_port, require_binary, wait_for

READY_TIMEOUT = 20.0


@dataclass
class Peer:
    """A running peer: its base URL, process and log file (read on failure)."""

    name: str
    url: str
    process: subprocess.Popen
    log: Path

    def get_json(self, path: str, params: dict[str, str] | None = None, timeout: float = 5.0) -> Any:
        query = "?" + urllib.parse.urlencode(params) if params else ""
        with urllib.request.urlopen(self.url + path + query, timeout=timeout) as resp:
            return json.load(resp)

    def query(self, expr: str, time: float | None = None) -> list[dict]:
        """Instant query (Prometheus only); returns the result vector, raises on a query error."""
        params = {"query": expr}
        if time is not None:
            params["time"] = str(time)
        body = self.get_json("/api/v1/query", params)
        if body.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {body}")
        return body["data"]["result"]

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=1.0) as resp:
            return resp.status == 200
    except OSError:
        return False


@contextmanager
def _run_peer(name: str, argv: list[str], url: str, log: Path) -> Iterator[Peer]:
    """Start `argv`, wait for /-/ready, yield the Peer, stop it by PID."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    peer = Peer(name, url, proc, log)
    try:
        try:
            wait_for(lambda: proc.poll() is not None or _ready(url), timeout=READY_TIMEOUT, what=f"{name} ready")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{name} log:\n{peer.log_tail()}") from None
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}:\n{peer.log_tail()}")
        yield peer
    finally:
        stop(proc)


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM the process we started (by its PID), SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


@contextmanager
def prometheus_server(workdir: Path, scrape_configs: list[dict] | None = None,
                      rule_files: list[Path] | None = None, alertmanager_url: str | None = None,
                      interval: str = "1s") -> Iterator[Peer]:
    """Prometheus with 1 s scrape and evaluation by default, optional rules and Alertmanager."""
    binary = require_binary("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "scrape_configs": scrape_configs or [],
        "rule_files": [str(Path(p).resolve()) for p in (rule_files or [])],
    }
    if alertmanager_url:
        target = urllib.parse.urlparse(alertmanager_url).netloc
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [target]}]}]}
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    argv = [binary, f"--config.file={config_file}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"]
    with _run_peer("prometheus", argv, f"http://127.0.0.1:{port}", workdir / "prometheus.log") as peer:
        yield peer


@contextmanager
def alertmanager_server(workdir: Path, config_text: str) -> Iterator[Peer]:
    """Alertmanager with the given config text; gossip listener off (--cluster.listen-address=)."""
    binary = require_binary("prometheus-alertmanager")
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "alertmanager.yml"
    config_file.write_text(config_text)
    port = free_port()
    argv = [binary, f"--config.file={config_file}", f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="]
    with _run_peer("alertmanager", argv, f"http://127.0.0.1:{port}", workdir / "alertmanager.log") as peer:
        yield peer


def agent_webhook_config(webhook_url: str, token_file: Path) -> str:
    """Alertmanager config on a test time scale: remediation="agent" alerts go to the agent's webhook
    (group_wait 0s, group_interval 1s, bearer token from a file, resolved sent); the rest go nowhere."""
    timing = {"group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"}
    return yaml.safe_dump({
        "route": {"receiver": "people", "group_by": ["alertname", "rack"], **timing,
                  "routes": [{"receiver": "agent", "matchers": ['remediation="agent"'],
                              "group_by": ["alertname", "rack", "node"], **timing}]},
        "receivers": [{"name": "people"}, {"name": "agent", "webhook_configs": [{
            "url": webhook_url, "send_resolved": True, "max_alerts": 0,
            "http_config": {"authorization": {"type": "Bearer", "credentials_file": str(token_file)}}}]}],
    }, sort_keys=False)


_FOR = re.compile(r"^(\s*for:\s*)\S+\s*$", re.M)
_RANGE = re.compile(r"\[(\d+)([smhd])\]")


def accelerated_rules(src: Path, dst: Path, for_: str = "0s", window: str = "10s") -> Path:
    """Copy a rule file with every `for:` set to `for_` and every range selector set to `window`.

    With 1 s scrapes the production windows (5m, 1h) would keep an alert
    firing for minutes after the fault clears; an end-to-end test wants the
    same expressions on a test time scale. Rates are per second, so
    thresholds keep their meaning when the window shrinks.
    """
    text = _FOR.sub(lambda m: f"{m.group(1)}{for_}", src.read_text())
    text = _RANGE.sub(f"[{window}]", text)
    dst.write_text(text)
    return dst
