"""One bearer-token check for every route, named admin tokens, `who` in the journal, reads behind the token
(issues 10 and 16), and the header abuse of issue 18 (non-UTF-8 Authorization, journal ?limit=)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from tests.agentproc import base_config, running_agent

ALICE, BOB = "alice-token-0123456789", "bob-token-9876543210"


def named_tokens_config(tmp_path: Path, **auth) -> dict:
    cfg = base_config(tmp_path)
    del cfg["secrets"]["admin_token"]
    for name, tok in (("alice", ALICE), ("bob", BOB)):
        (tmp_path / f"{name}.token").write_text(tok + "\n")
    cfg["auth"] = {"admin_tokens": {n: {"file": str(tmp_path / f"{n}.token")} for n in ("alice", "bob")}, **auth}
    cfg["inventory"] = {"nodes": ["node01"]}
    cfg["remediation"] = {"slurm": {"backend": "simulated"}}
    return cfg


def raw_get(port: int, path: str, header: bytes) -> int:
    """Status of a GET sent with a raw (possibly non-UTF-8) header line."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + header +
                  b"\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_named_tokens_record_who_and_reads_need_a_token(tmp_path):
    with running_agent(named_tokens_config(tmp_path), tmp_path) as agent:
        for path in ("/api/v1/incidents", "/api/v1/journal"):
            assert agent.get(path)[0] == 401
            assert agent.get(path, token="wrong")[0] == 401
            assert agent.get(path, token=ALICE)[0] == 200
        status, body = agent.request("POST", "/api/v1/breaker/reset", token=BOB)
        assert status == 200 and json.loads(body)["by"] == "bob"
        status, body = agent.request("POST", "/api/v1/breaker/reset", token=ALICE)
        assert status == 200 and json.loads(body)["by"] == "alice"
        entries = json.loads(agent.get("/api/v1/journal", token=ALICE)[1])["entries"]
        assert [e["detail"]["by"] for e in entries if e["kind"] == "breaker"][-2:] in (["bob", "alice"],
                                                                                     ["alice", "bob"])
        assert agent.request("POST", "/-/reload", token=BOB)[0] == 200
        assert agent.request("POST", "/-/reload")[0] == 401
        # /metrics, health and state stay open (no secret in them; Prometheus scrapes without a token)
        assert agent.get("/metrics")[0] == 200 and agent.get("/api/v1/state")[0] == 200


def test_non_utf8_and_non_ascii_authorization_is_401_not_500(tmp_path):
    with running_agent(named_tokens_config(tmp_path), tmp_path) as agent:
        for header in (b"Authorization: Bearer \xff\xfe\x80", b"Authorization: Bearer \xc3\xa9t\xc3\xa9",
                       b"Authorization: \xff", b"Authorization: Bearer " + ALICE.encode() + b"\xff"):
            assert raw_get(agent.port, "/api/v1/incidents", header) == 401, header
            assert raw_get(agent.port, "/api/v1/journal", header) == 401, header
        assert raw_get(agent.port, "/api/v1/incidents", b"Authorization: Bearer " + ALICE.encode()) == 200
        assert "Traceback" not in agent.log()


def test_journal_limit_is_validated(tmp_path):
    with running_agent(named_tokens_config(tmp_path), tmp_path) as agent:
        for _ in range(3):
            agent.request("POST", "/api/v1/breaker/reset", token=ALICE)
        for bad in ("-1", "0", "abc", "1e3", "5001", "%C2%B2", "99999999999999999999"):
            status, body = agent.get(f"/api/v1/journal?limit={bad}", token=ALICE)
            assert status == 400 and b"limit must be" in body, (bad, status, body)
        status, body = agent.get("/api/v1/journal?limit=2", token=ALICE)
        assert status == 200 and len(json.loads(body)["entries"]) == 2


def test_reads_without_any_admin_token_are_refused_unless_opened(tmp_path):
    cfg = base_config(tmp_path)
    del cfg["secrets"]["admin_token"]
    cfg["remediation"] = {"slurm": {"backend": "simulated"}}
    for d in ("closed", "open"):
        (tmp_path / d).mkdir()
    with running_agent(cfg, tmp_path / "closed") as agent:
        status, body = agent.get("/api/v1/incidents")
        assert status == 403 and b"no admin token configured" in body
        assert agent.request("POST", "/api/v1/breaker/reset")[0] == 403
    cfg["auth"] = {"open_reads": True}
    with running_agent(cfg, tmp_path / "open") as agent:
        assert agent.get("/api/v1/incidents")[0] == 200
        assert agent.get("/api/v1/journal")[0] == 200
        assert agent.request("POST", "/api/v1/breaker/reset")[0] == 403  # opening reads opens no write


def test_legacy_single_admin_token_is_named_admin(tmp_path):
    cfg = base_config(tmp_path)
    cfg["remediation"] = {"slurm": {"backend": "simulated"}}
    with running_agent(cfg, tmp_path) as agent:
        status, body = agent.request("POST", "/api/v1/breaker/reset", token="admin-token-for-tests")
        assert status == 200 and json.loads(body)["by"] == "admin"
        assert agent.get("/api/v1/incidents")[0] == 401
