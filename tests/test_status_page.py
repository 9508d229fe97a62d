"""The status page's server side on real agent processes: what it serves and to whom, the stream, the peers.

The page itself, in a real browser, is tests/test_status_browser.py.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agent.listener import CSP
from agent.status.peers import NodeCard
from tests.agentproc import AgentProcess, base_config, running_agent
from tests.helpers import REPO, free_port, wait_for
from tests.test_tls import pki  # noqa: F401 (the fixture: a CA, a server and a client certificate)

TOKEN = "admin-token-for-tests"
STATIC = REPO / "agent" / "status"


def _metric(agent: AgentProcess, name: str) -> float:
    value = _series(agent, name)
    assert value is not None, name
    return value


def _series(agent: AgentProcess, name: str) -> float | None:
    """The series' value, None while the agent (which answered) does not serve it yet (a wait's condition)."""
    m = re.search(rf"^{re.escape(name)} (\S+)$", agent.metrics(), re.M)
    return float(m.group(1)) if m else None


class Stream:
    """One status page stream, read as the page reads it (server-sent events over a kept-open GET)."""

    def __init__(self, port: int, token: str | None = None, ctx: ssl.SSLContext | None = None, timeout: float = 15):
        self.conn = (http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout) if ctx
                     else http.client.HTTPConnection("127.0.0.1", port, timeout=timeout))
        headers = {"Accept": "text/event-stream", **({"Authorization": f"Bearer {token}"} if token else {})}
        self.conn.request("GET", "/api/v1/status/stream", headers=headers)
        self.resp = self.conn.getresponse()

    def event(self, kind: str = "state") -> dict[str, Any]:
        """The next event of that kind (others skipped)."""
        name, data = None, []
        while True:
            line = self.resp.readline().decode()
            if not line:
                raise AssertionError("stream ended")
            line = line.rstrip("\n")
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif line == "" and data:
                if name == kind:
                    return json.loads("".join(data))
                name, data = None, []

    def close(self) -> None:
        self.conn.close()


def test_page_and_files_are_served_with_a_policy_that_allows_only_this_origin(tmp_path):
    with running_agent(base_config(tmp_path), tmp_path) as agent:
        status, body = agent.get("/")
        assert status == 200 and b"<title>supernode-agent status</title>" in body
        for path in ("/", "/status/status.js", "/status/status.css", "/status/icon.svg", "/metrics", "/no-such-page"):
            req = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=5)
            req.request("GET", path)
            resp = req.getresponse()
            resp.read()
            assert resp.getheader("Content-Security-Policy") == CSP, path
            assert resp.getheader("X-Content-Type-Options") == "nosniff", path
            req.close()
    assert "default-src 'none'" in CSP and "'unsafe-inline'" not in CSP and "*" not in CSP
    assert re.search(r"script-src 'self';.*style-src 'self';.*connect-src 'self';", CSP)
    # Nothing in the shipped page names another origin: every reference is relative to the agent.
    html = (STATIC / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs and all(r.startswith("status/") for r in refs), refs
    for name in ("status.js", "status.css", "index.html"):
        text = (STATIC / name).read_text()
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/|@import|url\(", text), name
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text and "eval(" not in text, name


def test_stream_shows_incidents_only_with_the_admin_token_as_the_api_does(tmp_path):
    cfg = base_config(tmp_path, token=TOKEN, inventory={"nodes": ["node01"]},
                      remediation={"slurm": {"backend": "simulated"}})
    with running_agent(cfg, tmp_path) as agent:
        anonymous = Stream(agent.port)
        hello = anonymous.event("hello")
        assert hello == {"incidents": False, "locked": "incidents and approvals need the admin token "
                                                        "(auth.open_reads is off)"}
        view = anonymous.event()
        assert "incidents" not in view and "reliability" not in view
        assert [n["name"] for n in view["nodes"]] == ["node01"] and view["nodes"][0]["reach"] == "self"
        NodeCard.model_validate(view["nodes"][0]["card"])  # this agent's card is what peers parse
        anonymous.close()
        wrong = Stream(agent.port, token="not-the-token")
        assert wrong.resp.status == 401
        wrong.close()
        admin = Stream(agent.port, token=TOKEN)
        assert admin.event("hello") == {"incidents": True, "who": "admin"}
        view = admin.event()
        assert view["incidents"]["open"] == [] and view["incidents"]["mode"] == "observe"
        assert {c["class"] for c in view["reliability"]["classes"]} >= {"gpu", "nvlink", "node"}
        admin.close()
        status, body = agent.get("/api/v1/status")
        assert status == 200 and json.loads(body)["incidents_locked"].startswith("incidents and approvals need")
    cfg["auth"] = {"open_reads": True}
    with running_agent(cfg, tmp_path) as agent:
        opened = Stream(agent.port)
        assert opened.event("hello")["incidents"] is True and "incidents" in opened.event()
        opened.close()


def test_no_view_is_built_while_no_page_is_open(tmp_path):
    """The agent's CPU budget: publishes with no page open cost nothing but a test of the client set."""
    (tmp_path / "sys" / "class" / "net").mkdir(parents=True)  # a port without its sysfs files: polls, publishes
    cfg = base_config(tmp_path, inventory={"nodes": ["node01"], "ports": [{"name": "eth0"}]},
                      sources={"nvml": {"enabled": False}, "links": {"interval": 0.2, "timeout": 0.1},
                               "dom": {"enabled": False}, "sysfs_root": str(tmp_path / "sys")},
                      remediation={"slurm": {"backend": "simulated"}})
    with running_agent(cfg, tmp_path) as agent:
        def polls() -> float:
            return _series(agent, 'supernode_source_last_success_timestamp_seconds{device="node01",source="links"}') or 0.0
        first = wait_for(polls, 20, what="the links source polling")
        wait_for(lambda: polls() > first + 1, 20, what="several publishes")
        assert _metric(agent, "supernode_status_page_updates_total") == 0
        page = Stream(agent.port)
        page.event()
        page.event()  # a second update: the publishes now build views
        assert _metric(agent, "supernode_status_page_clients") == 1
        assert _metric(agent, "supernode_status_page_updates_total") >= 2
        page.close()
        wait_for(lambda: _metric(agent, "supernode_status_page_clients") == 0, 20, what="the closed page noticed")
        built = _metric(agent, "supernode_status_page_updates_total")
        now = polls()
        wait_for(lambda: polls() > now + 1, 20, what="more publishes")
        assert _metric(agent, "supernode_status_page_updates_total") == built


def test_the_rack_section_says_how_the_rack_coordinates_and_when_coordination_is_lost(tmp_path):
    """Static: up, from the config, who leads. etcd out of reach: degraded, why, nobody leads, said in the
    attention line too (the page draws both from this view)."""
    def view(agent: AgentProcess) -> dict[str, Any]:
        status, body = agent.get("/api/v1/status", token=TOKEN)
        assert status == 200, body
        return json.loads(body)

    (tmp_path / "static").mkdir()
    cfg = base_config(tmp_path / "static", token=TOKEN, inventory={"nodes": ["node01", "node02"]},
                      remediation={"slurm": {"backend": "simulated"}})
    cfg["agent"]["node"] = "node02"
    with running_agent(cfg, tmp_path / "static") as agent:
        assert view(agent)["coordination"] == {"backend": "static", "state": "up", "leader": "node01",
                                               "this_agent_leads": False, "members": None, "polls_here": [],
                                               "polled_elsewhere": [], "why": ""}
    (tmp_path / "etcd").mkdir()
    cfg = base_config(tmp_path / "etcd", token=TOKEN, inventory={"nodes": ["node01", "node02"]},
                      remediation={"slurm": {"backend": "simulated"}},
                      coordination={"backend": "etcd", "lease_ttl_seconds": 1.0,
                                    "etcd": {"endpoints": [f"http://127.0.0.1:{free_port()}"],
                                             "request_timeout_seconds": 0.3}})
    with running_agent(cfg, tmp_path / "etcd") as agent:
        line = wait_for(lambda: (c := view(agent)["coordination"])["why"] and c, 30, what="the reason etcd is lost")
        assert line["backend"] == "etcd" and line["state"] == "degraded"
        assert line["leader"] is None and line["this_agent_leads"] is False and line["members"] is None
        assert "connect" in line["why"].lower() or "refused" in line["why"].lower(), line["why"]
        assert _metric(agent, 'supernode_coordination_up{backend="etcd"}') == 0


def _peer_config(tmp_path: Path, me: str, urls: dict[str, str], **extra: Any) -> dict[str, Any]:
    (tmp_path / me).mkdir(exist_ok=True)
    cfg = base_config(tmp_path / me, inventory={"nodes": ["node01", "node02", "node03"], "agent_urls": urls},
                      remediation={"slurm": {"backend": "simulated"}}, **extra)
    cfg["agent"]["node"] = me
    return cfg


class _Liar:
    """A peer that answers 200 with something that is not a node card."""

    def __init__(self):
        self.port = free_port()

    async def handler(self, request: web.Request) -> web.Response:
        return web.json_response({"name": "node03", "gpus": [{"index": "<img src=x>", "nvlink": ["on fire"]}]})


def test_other_nodes_come_from_their_agents_or_say_why_not(tmp_path):
    import asyncio
    import threading

    liar = _Liar()
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/api/v1/status/node", liar.handler)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", liar.port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    node02_port = free_port()
    urls = {"node02": f"http://127.0.0.1:{node02_port}", "node03": f"http://127.0.0.1:{liar.port}"}
    cfg1 = _peer_config(tmp_path, "node01", urls)
    cfg2 = _peer_config(tmp_path, "node02", {})
    cfg2["listen"]["port"] = node02_port
    try:
        with running_agent(cfg1, tmp_path / "node01") as node01:
            page = Stream(node01.port)

            def nodes() -> dict[str, dict]:
                return {n["name"]: n for n in page.event()["nodes"]}
            seen = wait_for(lambda: (n := nodes())["node02"]["reach"] == "unreachable" and
                            n["node03"]["reach"] == "unreachable" and n, 20, what="both peers judged")
            assert "Connect" in seen["node02"]["why"] or "refused" in seen["node02"]["why"], seen["node02"]
            assert seen["node03"]["why"].startswith("answer is not a node card"), seen["node03"]
            assert seen["node03"]["card"] is None  # nothing of a bad answer is passed on
            with running_agent(cfg2, tmp_path / "node02"):
                seen = wait_for(lambda: (n := nodes())["node02"]["reach"] == "peer" and n, 20, what="node02 answering")
                assert seen["node02"]["card"]["name"] == "node02" and seen["node02"]["age_seconds"] is not None
            # node02's agent stopped: not reachable, its last card kept (dimmed on the page) with its age
            seen = wait_for(lambda: (n := nodes())["node02"]["reach"] == "unreachable" and n, 20, what="node02 gone")
            assert seen["node02"]["card"]["name"] == "node02"
            page.close()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_peers_over_tls_are_verified_and_mutual_tls_is_answered(tmp_path, pki):  # noqa: F811
    """node02 requires client certificates; node01 reaches it only with the right CA and its own certificate.
    A reload that adds them applies to the next poll."""
    node02_port = free_port()
    url = f"https://127.0.0.1:{node02_port}"
    cfg2 = _peer_config(tmp_path, "node02", {})
    cfg2["listen"].update(port=node02_port, tls={"cert_file": str(pki["server"][0]), "key_file": str(pki["server"][1]),
                                                 "client_ca_file": str(pki["ca"])})
    cfg1 = _peer_config(tmp_path, "node01", {"node02": url})
    agent2 = AgentProcess(cfg2, tmp_path / "node02")
    agent2.write_config(cfg2)
    import subprocess
    import sys

    log = open(agent2.log_path, "ab")
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "--config", str(agent2.config_path), "run"],
                            stdout=log, stderr=log, cwd=REPO)
    try:
        ctx = ssl.create_default_context(cafile=str(pki["ca"]))
        ctx.load_cert_chain(*map(str, pki["client"]))

        def up() -> bool:
            try:
                conn = http.client.HTTPSConnection("127.0.0.1", node02_port, context=ctx, timeout=2)
                conn.request("GET", "/healthz")
                return conn.getresponse().status == 200
            except (OSError, ssl.SSLError):
                return False
        wait_for(up, 20, what="node02 over mutual TLS")
        cfg1["status"] = {"peer_tls": {"ca_file": str(tmp_path / "no-such-ca.crt")}}
        with running_agent(cfg1, tmp_path / "node01") as node01:
            page = Stream(node01.port)

            def node02() -> dict:
                return next(n for n in page.event()["nodes"] if n["name"] == "node02")
            seen = wait_for(lambda: (n := node02())["reach"] == "unreachable" and n, 20, what="node02 judged")
            assert seen["why"].startswith("status.peer_tls does not load: No such file"), seen
            page.close()
            del cfg1["status"]  # the system's CAs: they do not know the test CA
            node01.write_config(cfg1)
            assert node01.request("POST", "/-/reload", token=TOKEN)[0] == 200
            page = Stream(node01.port)
            seen = wait_for(lambda: (n := node02())["reach"] == "unreachable" and "verify" in n["why"] and n, 20,
                            what="node02 judged with the system CAs")
            assert "CERTIFICATE_VERIFY_FAILED" in seen["why"] or "certificate verify failed" in seen["why"], seen
            page.close()
            cfg1["status"] = {"peer_tls": {"ca_file": str(pki["ca"]), "cert_file": str(pki["client"][0]),
                                           "key_file": str(pki["client"][1])}}
            node01.write_config(cfg1)
            assert node01.request("POST", "/-/reload", token=TOKEN)[0] == 200
            page = Stream(node01.port)
            seen = wait_for(lambda: (n := node02())["reach"] == "peer" and n, 20, what="node02 verified")
            assert seen["card"]["name"] == "node02"
            page.close()
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_agent_urls_are_checked_at_load(tmp_path):
    from agent.config import ConfigError, parse_config

    for bad, why in ((["node09", "http://127.0.0.1:1"], "agent_urls: ['node09'] not in inventory.nodes"),
                     (["node02", "http://127.0.0.1:1/api"], "inventory.agent_urls.node02"),
                     (["node02", "file:///etc/passwd"], "inventory.agent_urls.node02")):
        cfg = _peer_config(tmp_path, "node01", {bad[0]: bad[1]})
        with pytest.raises(ConfigError, match=re.escape(why)):
            parse_config(cfg)


def test_more_pages_than_max_clients_are_refused_and_the_page_can_be_switched_off(tmp_path):
    cfg = base_config(tmp_path, inventory={"nodes": ["node01"]}, status={"max_clients": 1},
                      remediation={"slurm": {"backend": "simulated"}})
    with running_agent(cfg, tmp_path) as agent:
        first = Stream(agent.port)
        first.event("hello")
        second = Stream(agent.port)
        assert second.resp.status == 503
        assert b"status.max_clients" in second.resp.read()
        second.close()
        first.close()
        cfg["status"] = {"enabled": False}
        agent.write_config(cfg)
        assert agent.request("POST", "/-/reload", token=TOKEN)[0] == 200
        for path in ("/", "/status/status.js", "/api/v1/status", "/api/v1/status/stream", "/api/v1/status/node"):
            status, body = agent.get(path)
            assert status == 404 and b"status.enabled" in body, path
        assert agent.get("/metrics")[0] == 200


def test_anonymous_pages_cannot_take_the_slots_kept_for_the_admin_token(tmp_path):
    """Anonymous streams fill their own slots (the next is a 503), and a page with the admin token still gets
    its stream and its hello: anonymous pages once took every slot and the admin's stream got a 503."""
    cfg = base_config(tmp_path, token=TOKEN, inventory={"nodes": ["node01"]},
                      status={"max_clients": 3, "reserved_admin_clients": 1},
                      remediation={"slurm": {"backend": "simulated"}})
    with running_agent(cfg, tmp_path) as agent:
        held = [Stream(agent.port) for _ in range(3)]
        try:
            for s in held:
                assert s.resp.status == 200 and s.event("hello")["incidents"] is False
            extra = Stream(agent.port)
            assert extra.resp.status == 503
            assert b"status.max_clients 3" in extra.resp.read()
            extra.close()
            admin = Stream(agent.port, token=TOKEN)
            assert admin.resp.status == 200
            assert admin.event("hello") == {"incidents": True, "who": "admin"}
            assert "incidents" in admin.event()
            # The reserved slot taken, the listener's bound holds for the token too.
            second = Stream(agent.port, token=TOKEN)
            assert second.resp.status == 503 and b"reserved_admin_clients 1" in second.resp.read()
            second.close()
            admin.close()
        finally:
            for s in held:
                s.close()
