"""Alertmanager webhook on a real loopback aiohttp server: auth, validation, dedupe, concurrency, approve."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import SecretStr

from sim.scheduler import SimulatedScheduler
from agent.remediation.api import add_remediation_routes
from agent.remediation.engine import Executors

from tests.helpers import await_for, free_port
from tests.remediation_support import engine, inventory, results

TOKEN, ADMIN = "hook-secret", "admin-secret"


def alert(node="node01", status="firing", fp="fp1", starts="2026-01-01T00:00:00Z", name="GpuXidCritical", **extra):
    a = {"status": status, "labels": {"alertname": name, "node": node, "severity": "critical"},
         "annotations": {}, "startsAt": starts, "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://p"}
    if fp is not None:
        a["fingerprint"] = fp
    a.update(extra)
    return a


def payload(*alerts, version="4", **extra):
    return {"version": version, "groupKey": "{}:{}", "truncatedAlerts": 0, "status": alerts[0]["status"],
            "receiver": "agent", "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://am", "alerts": list(alerts), **extra}


async def serve(eng, max_body=65536):
    app = web.Application()
    add_remediation_routes(app, eng, SecretStr(ADMIN), SecretStr(TOKEN), max_body)
    reg = CollectorRegistry()
    reg.register(eng.collector())

    async def metrics(_: web.Request) -> web.Response:  # aiohttp deprecates plain-function handlers
        return web.Response(body=generate_latest(reg), content_type="text/plain")

    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}", reg


def test_webhook_rejects_bad_input_and_acts_once(tmp_path):
    async def main():
        sched = SimulatedScheduler(["node01", "node02"])
        pb = tmp_path / "pb"
        pb.mkdir()
        (pb / "xid.yaml").write_text("name: am-xid\ntrigger: {alertname: GpuXidCritical}\n"
                                     "steps: [{action: drain, targets: nodes}]\n")
        eng = engine(tmp_path, executors=Executors(scheduler=sched), max_drained_fraction=1.0)
        eng.playbooks = __import__("agent.remediation.playbooks", fromlist=["x"]).load_playbooks(pb)
        await eng.start()
        runner, url, reg = await serve(eng, max_body=4096)
        hook = url + "/api/v1/alerts"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as s:
            async def post(body, headers=auth, raw=None):
                async with s.post(hook, data=raw if raw is not None else json.dumps(body), headers=headers) as r:
                    return r.status
            assert await post(payload(alert()), headers={}) == 401
            assert await post(payload(alert()), headers={"Authorization": "Bearer wrong"}) == 401
            assert await post(None, raw=b"{not json") == 400
            assert await post(payload(alert(), version="3")) == 400
            assert await post(None, raw=b"x" * 5000) == 413
            assert await post(payload(alert(node="node99"))) == 422
            assert await post({**payload(alert()), "alerts": [{"labels": {}}]}) == 422
            assert not results(eng, kind="incident")
            # five identical deliveries, plus one without the optional fingerprint/truncatedAlerts fields
            codes = [await post(payload(alert())) for _ in range(5)]
            assert codes == [200] * 5
            legacy = payload(alert(node="node02", fp=None))
            del legacy["truncatedAlerts"]
            assert await post(legacy) == 200
            await await_for(lambda: sched.nodes["node01"].drained and sched.nodes["node02"].drained)
            assert len(results(eng, kind="intent", action="drain")) == 2
            assert reg.get_sample_value("supernode_webhook_requests_total", {"result": "duplicate"}) == 4
            assert reg.get_sample_value("supernode_webhook_requests_total", {"result": "unauthorized"}) == 2
            # resolved closes the incident and undoes
            assert await post(payload(alert(status="resolved"))) == 200
            await await_for(lambda: not sched.nodes["node01"].drained)
            # admin endpoints
            async with s.get(url + "/api/v1/incidents", headers={"Authorization": f"Bearer {ADMIN}"}) as r:
                data = await r.json()
                assert r.status == 200 and [i["targets"]["node"] for i in data["open"]] == ["node02"]
            async with s.post(url + "/api/v1/breaker/reset", headers=auth) as r:
                assert r.status == 401
            async with s.post(url + "/api/v1/breaker/reset", headers={"Authorization": f"Bearer {ADMIN}"}) as r:
                assert r.status == 200
        await runner.cleanup()
        await eng.stop()
    asyncio.run(main())


def test_webhook_500_concurrent_distinct_payloads_all_recorded(tmp_path):
    async def main():
        nodes = [f"node{i:02d}" for i in range(1, 11)]
        eng = engine(tmp_path, mode="observe", inv=inventory(nodes=nodes))
        await eng.start()
        runner, url, reg = await serve(eng)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=50)) as s:
            async def post(i):
                # 500 distinct incidents of a known detector: (node, gpu, link) all differ
                labels = {"alertname": "SupernodeNvlinkErrors", "detector": "nvlink_errors", "node": nodes[i % 10],
                          "gpu": str(i // 10 % 4), "link": str(i // 40), "severity": "warning"}
                body = payload(alert(fp=f"fp{i}", starts=f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z",
                                     labels=labels))
                async with s.post(url + "/api/v1/alerts", json=body, headers=auth) as r:
                    return r.status
            async def scrape():
                async with s.get(url + "/metrics") as r:
                    return r.status
            codes = await asyncio.gather(*(post(i) for i in range(500)), *(scrape() for _ in range(10)))
        assert codes == [200] * 510
        assert eng.journal.flush()  # rows are committed by the journal's writer thread
        n = eng.journal._db.execute("SELECT COUNT(*) FROM webhook_alerts").fetchone()[0]
        assert n == 500 and len(eng.incidents.open_incidents()) == 500
        assert reg.get_sample_value("supernode_webhook_requests_total", {"result": "accepted"}) == 500
        await runner.cleanup()
        await eng.stop()
    asyncio.run(main())


def test_webhook_alert_lands_in_its_detectors_incident_and_playbook(tmp_path):
    """Shipped rules carry `detector`: the delivery runs that detector's playbook (no alertname trigger needed)."""
    from agent.remediation.webhook import handle_payload

    async def main():
        sched = SimulatedScheduler(["node01", "node02"])
        eng = engine(tmp_path, executors=Executors(scheduler=sched), max_drained_fraction=1.0)
        await eng.start()
        labels = {"alertname": "SupernodeNvlinkErrors", "detector": "nvlink_errors", "rack": "r01",
                  "node": "node02", "gpu": "0", "link": "3", "uuid": "GPU-x", "severity": "critical"}
        firing = alert(name="SupernodeNvlinkErrors", fp="nv1", labels=labels)
        assert handle_payload(eng, json.dumps(payload(firing)).encode()) == {"accepted": 1, "duplicates": 0,
                                                                             "ignored": 0}
        inc = eng.incidents.find("nvlink_errors", {"node": "node02", "gpu": "0", "link": "3"})
        assert inc is not None and inc.source == "alertmanager" and inc.playbook == "nvlink-errors"
        await await_for(lambda: inc.state == "mitigated", timeout=10)
        assert (await sched.state("node02")).drained
        # Without a `detector` label the alertname keys the incident; one no detector or playbook knows is
        # counted and dropped, never stored (issue 18: no unbounded incidents or series from the webhook).
        bare = alert(name="SomeOtherAlert", fp="o1", labels={"alertname": "SomeOtherAlert", "node": "node01"})
        assert handle_payload(eng, json.dumps(payload(bare)).encode())["ignored"] == 1
        assert eng.incidents.find("SomeOtherAlert", {"node": "node01"}) is None
        assert eng.webhook_ignored == {"unknown_alertname": 1}
        resolved = {**firing, "status": "resolved", "endsAt": "2026-01-01T00:01:00Z"}
        handle_payload(eng, json.dumps(payload(resolved)).encode())
        await await_for(lambda: not sched.nodes["node02"].drained, timeout=10, what="node02 resumed")
        assert inc.state == "resolved"
        await eng.stop()
    asyncio.run(main())
