"""HTTPS with client certificates: the agent's listener, /metrics and the webhook behind mutual TLS."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from tests.agentproc import AgentProcess, base_config
from tests.helpers import REPO, wait_for
from tests.pki import make_cert, new_key, write_pair


_key, _write, _cert = new_key, write_pair, make_cert


@pytest.fixture
def pki(tmp_path):
    ca_key = _key()
    ca = _cert("supernode test CA", ca_key, ca_key, None, ca=True, server=False)
    ca_crt, _ = _write(tmp_path / "ca", ca_key, ca)
    srv_key = _key()
    srv_crt, srv_key_path = _write(tmp_path / "server", srv_key, _cert("127.0.0.1", srv_key, ca_key, ca.subject,
                                                                      ca=False, server=True))
    cli_key = _key()
    cli_crt, cli_key_path = _write(tmp_path / "client", cli_key, _cert("alertmanager", cli_key, ca_key, ca.subject,
                                                                      ca=False, server=False))
    rogue_key = _key()  # a client certificate from a CA the agent does not trust
    rogue = _cert("rogue", rogue_key, rogue_key, None, ca=False, server=False)
    rogue_crt, rogue_key_path = _write(tmp_path / "rogue", rogue_key, rogue)
    return {"ca": ca_crt, "server": (srv_crt, srv_key_path), "client": (cli_crt, cli_key_path),
            "rogue": (rogue_crt, rogue_key_path)}


def _context(pki, client: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if client:
        ctx.load_cert_chain(*map(str, pki[client]))
    return ctx


def _get(url: str, ctx: ssl.SSLContext, data: bytes | None = None, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_mutual_tls_guards_metrics_and_webhook(tmp_path, pki):
    (tmp_path / "webhook.token").write_text("hook-token\n")
    cfg = base_config(tmp_path)
    cfg["listen"]["tls"] = {"cert_file": str(pki["server"][0]), "key_file": str(pki["server"][1]),
                            "client_ca_file": str(pki["ca"])}
    cfg["secrets"]["webhook_token"] = {"file": str(tmp_path / "webhook.token")}
    cfg["inventory"] = {"nodes": ["node01"]}
    cfg["remediation"] = {"slurm": {"backend": "simulated"}}
    agent = AgentProcess(cfg, tmp_path)  # started by hand: its health wait speaks plain HTTP
    url = f"https://127.0.0.1:{agent.port}"
    agent.write_config(cfg)
    log = open(agent.log_path, "ab")
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "--config", str(agent.config_path), "run"],
                            stdout=log, stderr=log, cwd=REPO)
    try:
        good = _context(pki, "client")

        def up() -> bool:
            try:
                return _get(url + "/healthz", good)[0] == 200
            except (OSError, ssl.SSLError):
                return False
        wait_for(up, 20, what="agent answering over mutual TLS")
        status, body = _get(url + "/metrics", good)
        assert status == 200 and b"supernode_agent_info" in body

        for client in (None, "rogue"):  # no certificate, or one from a CA the agent does not trust
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                _get(url + "/metrics", _context(pki, client))
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://127.0.0.1:{agent.port}/metrics", timeout=5).read()

        alert = {"version": "4", "status": "firing", "receiver": "agent", "groupKey": "k", "truncatedAlerts": 0,
                 "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://am",
                 "alerts": [{"status": "firing", "labels": {"alertname": "SupernodeGpuLost", "node": "node01",
                                                            "gpu": "0", "rack": "r01", "severity": "critical"},
                             "annotations": {}, "startsAt": "2026-11-30T00:00:00Z",
                             "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": "f1"}]}
        data = json.dumps(alert).encode()
        assert _get(url + "/api/v1/alerts", good, data)[0] == 401  # TLS alone is not enough: token too
        status, body = _get(url + "/api/v1/alerts", good, data, token="hook-token")
        assert status == 200, body
        # Under mTLS the caller recorded for an admin action names both: the token (who holds it) and the
        # client certificate's subject (the machine it came from); neither replaces the other.
        status, body = _get(url + "/api/v1/breaker/reset", good, b"", token="admin-token-for-tests")
        assert status == 200 and json.loads(body)["by"] == "admin (CN=alertmanager)", body
        status, body = _get(url + "/api/v1/journal", good, token="admin-token-for-tests")
        assert status == 200, body
        resets = [e for e in json.loads(body)["entries"] if e["kind"] == "breaker"]
        assert [e["detail"]["by"] for e in resets] == ["admin (CN=alertmanager)"], resets
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
