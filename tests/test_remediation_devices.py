"""Remediation through the agent's own wiring against real devices.

Every engine here is `wiring.build_engine(parse_config(...))`, the same call
the daemon makes, so the executors under test are the wired ones: `ip link`
on a veth in a namespace the test creates, Modbus writes to the simulated
reference CDU, SNMP SETs to the simulated Raritan PDU, an allow-listed
program, a notify POST to an aiohttp server, and NVML power limits through
the twin, including a SIGKILL between intent and result.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from agent.config import parse_config
from agent.remediation.engine import RemediationEngine
from agent.remediation.wiring import build_engine
from sim.modbus_devices import reference_cdu
from sim.rack import RackModel
from sim.snmp_pdu import SWITCH_STATE, STATE_OFF, STATE_ON, SimulatedRaritanPdu
from exporters.cooling.modbus_control import read_control_point

from tests.helpers import REPO, await_for, free_port, require_binary, wait_for
from tests.nvml_sim import NvmlSimServer
from tests.remediation_support import results
from tests.test_links_kernel import _operstate, veth  # noqa: F401  (the netns/veth fixture)
from tests.test_modbus_sim import _mbpoll
from tests.test_webhook import ADMIN, TOKEN, alert, payload, serve

GUARD = {"cooldown_seconds": 0, "retry_backoff_seconds": 0.01, "max_drained_fraction": 1.0}
HOOK_AUTH = {"Authorization": f"Bearer {TOKEN}"}


def config(tmp_path: Path, inventory: dict[str, Any], remediation: dict[str, Any] | None = None,
           sources: dict[str, Any] | None = None) -> dict[str, Any]:
    """An enforce-mode agent config for node01, the rack leader of a two-node rack."""
    rem = dict(remediation or {})
    return {"agent": {"rack": "r01", "node": "node01", "mode": "enforce", "state_dir": str(tmp_path)},
            "inventory": {"nodes": ["node01", "node02"], "gpus": {"count": 2}, **inventory},
            "sources": {"nvml": {"enabled": False}, **(sources or {})},
            "remediation": {"slurm": {"backend": "simulated"}, **rem,
                            "guardrails": {**GUARD, **rem.get("guardrails", {})}}}


def wired(cfg: dict[str, Any]) -> RemediationEngine:
    return build_engine(parse_config(cfg))


def playbook_dir(tmp_path: Path, *books: dict[str, Any]) -> str:
    d = tmp_path / "playbooks"
    d.mkdir()
    for b in books:
        (d / f"{b['name']}.yaml").write_text(yaml.safe_dump(b))
    return str(d)


def blocked(eng: RemediationEngine, action: str) -> list[tuple[str, str]]:
    return [(e.target, e.detail["guardrail"]) for e in results(eng, kind="blocked", action=action)]


def results_of(eng: RemediationEngine, action: str) -> list[str]:
    return [e.result for e in results(eng, kind="result", action=action)]


# -- isolate_link on a real veth ------------------------------------------------------


def test_isolate_link_takes_an_isolatable_veth_down_and_resolve_brings_it_up(veth, tmp_path):  # noqa: F811
    async def main():
        eng = wired(config(tmp_path, {"ports": [{"name": veth, "kind": "eth", "isolatable": True}]}))
        await eng.start()
        inc = eng.fire("optic_degraded", {"port": veth}, "warning")
        await await_for(lambda: inc.state == "mitigated", what="link isolated")
        assert _operstate(veth) == "down"
        (done,) = results(eng, kind="result", action="isolate_link")
        assert done.result == "done" and done.target == f"port={veth}"
        assert done.detail["before"] == {"up": True, "owned": True} and done.detail["after"] == {"up": False}
        eng.clear("optic_degraded", {"port": veth})
        await await_for(lambda: _operstate(veth) == "up", timeout=10, what="link back up after resolve")
        await await_for(lambda: results_of(eng, "isolate_link") == ["done", "undone"], what="undo journaled")
        await eng.stop()
    asyncio.run(main())


def test_port_not_isolatable_is_never_touched_even_when_an_alert_names_it(veth, tmp_path):  # noqa: F811
    async def main():
        carrier = Path(f"/sys/class/net/{veth}/carrier_changes")
        changes = carrier.read_text()
        eng = wired(config(tmp_path, {"ports": [{"name": veth, "kind": "eth", "isolatable": False}]}))
        await eng.start()
        runner, url, reg = await serve(eng)
        a = alert(name="optic_degraded", fp="optic1")
        a["labels"]["port"] = veth
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/api/v1/alerts", json=payload(a), headers=HOOK_AUTH) as r:
                assert r.status == 200
        await await_for(lambda: blocked(eng, "isolate_link"), what="isolate_link blocked")
        assert blocked(eng, "isolate_link") == [(f"port={veth}", "not_isolatable")]
        assert not results(eng, kind="intent", action="isolate_link")  # nothing was ever attempted
        assert reg.get_sample_value("supernode_remediation_blocked_total",
                                    {"playbook": "optic-degraded", "guardrail": "not_isolatable"}) == 1
        assert _operstate(veth) == "up" and carrier.read_text() == changes
        await runner.cleanup()
        await eng.stop()
    asyncio.run(main())


# -- cdu_write: the leak playbook's zone valve on the simulated reference CDU ------------


def test_leak_valve_close_waits_for_approval_and_reopens_only_after_a_person_approves(tmp_path):
    mbpoll = require_binary("mbpoll")

    async def main():
        model = RackModel(nodes=2, gpus_per_node=2)  # one leak zone, zone-a, both nodes
        dev = reference_cdu(model, "cdu1", port=free_port())
        await dev.start()
        port = dev.endpoint[1]
        cdu = {"name": "cdu1", "profile": "reference-cdu", "host": "127.0.0.1", "port": port,
               "channels": {1: "zone-a"}}
        loaded = parse_config(config(tmp_path, {
            "cdus": [cdu], "leak_zones": [{"name": "zone-a", "nodes": ["node01", "node02"],
                                           "valve": "cdu1:zone_valve_1"}]}))
        eng = build_engine(loaded)
        sched = eng.executors.scheduler
        valve_cfg = loaded.config.inventory.cdus[0]
        coil = lambda: asyncio.to_thread(_mbpoll, mbpoll, port, "0", 0, 1)  # noqa: E731  coil 0 = zone_valve_1
        await eng.start()
        inc = eng.fire("leak", {"zone": "zone-a"}, "critical")
        await await_for(lambda: eng.pending, what="valve approval pending")
        (p,) = eng.pending.values()
        assert (p.action, p.target, p.phase, p.approval) == ("cdu_write", "cdu=cdu1,point=zone_valve_1", "apply",
                                                             "cdu_write_valve")
        assert [x["id"] for x in eng.incidents_view()["pending_approvals"]] == [p.id]
        assert sched.nodes["node01"].drained and not sched.nodes["node02"].drained  # local: own node only
        assert model.coolant.valve_open["zone-a"] is True and await coil() == [1.0]
        assert not results(eng, kind="intent", action="cdu_write")
        assert eng.approve(p.id, who="test") == [p.id]
        await await_for(lambda: inc.state == "mitigated", what="mitigated after approval")
        assert model.coolant.valve_open["zone-a"] is False
        assert await read_control_point(valve_cfg, "zone_valve_1") == 0.0 and await coil() == [0.0]
        (done,) = results(eng, kind="result", action="cdu_write")
        assert done.result == "done" and done.detail["before"]["value"] == 1.0 and done.detail["after"]["value"] == 0.0

        # The leak clears: nothing reopens or resumes until a person approves, valve first.
        eng.clear("leak", {"zone": "zone-a"})
        await await_for(lambda: eng.pending, what="undo approval pending")
        (p,) = eng.pending.values()
        assert (p.action, p.phase, p.approval) == ("cdu_write", "undo", "resume_after_leak")
        assert model.coolant.valve_open["zone-a"] is False and sched.nodes["node01"].drained
        eng.approve(p.id, who="test")
        await await_for(lambda: model.coolant.valve_open["zone-a"], what="valve reopened")
        assert await coil() == [1.0] and await read_control_point(valve_cfg, "zone_valve_1") == 1.0
        await await_for(lambda: any(x.action == "drain" for x in eng.pending.values()), what="resume approval")
        assert sched.nodes["node01"].drained
        (p,) = eng.pending.values()
        eng.approve(p.id, who="test")
        await await_for(lambda: not sched.nodes["node01"].drained, what="node01 resumed")
        assert results_of(eng, "cdu_write") == ["done", "undone"]
        await eng.stop()
        await dev.stop()
    asyncio.run(main())


# -- pdu_outlet on the simulated Raritan PDU, read back over SNMP ------------------------

POWER_OFF = {"name": "node-power-off", "trigger": {"alertname": "NodePowerOff"},
             "steps": [{"action": "pdu_outlet", "targets": "outlets", "params": {"state": "off"},
                        "approval": "pdu_outlet_off"}]}


def _snmp_switch_state(snmpget: str, port: int, outlet: int) -> int:
    oid = ".".join(map(str, SWITCH_STATE + (1, outlet)))
    out = subprocess.run([snmpget, "-v2c", "-c", "public", "-r", "0", "-t", "2", "-Oqve", f"127.0.0.1:{port}", oid],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def test_pdu_outlet_off_is_held_for_approval_then_switched_and_undone(tmp_path):
    snmpget = require_binary("snmpget")

    async def main():
        model = RackModel(nodes=2, gpus_per_node=2)
        dev = SimulatedRaritanPdu(model, "pdu-a")  # port 0: a free UDP port
        await dev.start()
        port = dev.endpoint[1]
        states = lambda *outs: asyncio.gather(*(asyncio.to_thread(_snmp_switch_state, snmpget, port, o)  # noqa: E731
                                                for o in outs))
        eng = wired(config(tmp_path, {"pdus": [{"name": "pdu-a", "profile": "raritan-pdu2", "host": "127.0.0.1",
                                                "port": port, "outlets": dev.feeds()}]},
                           {"playbook_dir": playbook_dir(tmp_path, POWER_OFF)}))
        await eng.start()
        runner, url, _ = await serve(eng)
        # node01: resolved while its approvals wait -> blocked by the approval guardrail, never switched
        first = eng.fire("NodePowerOff", {"node": "node01"}, "critical")
        await await_for(lambda: len(eng.pending) == 2, what="node01 approvals")
        eng.clear("NodePowerOff", {"node": "node01"})
        await await_for(lambda: len(blocked(eng, "pdu_outlet")) == 2, what="node01 steps blocked")
        assert sorted(blocked(eng, "pdu_outlet")) == [("outlet=1,pdu=pdu-a", "approval"),
                                                      ("outlet=2,pdu=pdu-a", "approval")]
        assert await states(1, 2) == [STATE_ON, STATE_ON] and model.nodes["node01"].powered
        # node02 (outlets 3 and 4): held, approved over the API, switched off and read back
        inc = eng.fire("NodePowerOff", {"node": "node02"}, "critical")
        await await_for(lambda: len(eng.pending) == 2, what="node02 approvals")
        assert {(p.target, p.approval) for p in eng.pending.values()} == {
            ("outlet=3,pdu=pdu-a", "pdu_outlet_off"), ("outlet=4,pdu=pdu-a", "pdu_outlet_off")}
        pending = [e for e in results(eng, kind="approval", incident_id=inc.id) if e.result == "pending"]
        assert [e.detail["approval"] for e in pending] == ["pdu_outlet_off"] * 2
        assert await states(3, 4) == [STATE_ON, STATE_ON] and model.nodes["node02"].powered
        async with aiohttp.ClientSession() as s:
            # two steps pending under one incident id: listed, none approved, until the person says all
            async with s.post(f"{url}/api/v1/incidents/{inc.id}/approve",
                              headers={"Authorization": f"Bearer {ADMIN}"}) as r:
                assert r.status == 409
                assert sorted(p["target"] for p in (await r.json())["pending"]) == [
                    "outlet=3,pdu=pdu-a", "outlet=4,pdu=pdu-a"]
            assert not [e for e in results(eng, kind="approval", incident_id=inc.id) if e.result == "approved"]
            async with s.post(f"{url}/api/v1/incidents/{inc.id}/approve?all=true",
                              headers={"Authorization": f"Bearer {ADMIN}"}) as r:
                assert r.status == 200 and len((await r.json())["approved"]) == 2
        rows = [e for e in results(eng, kind="approval", incident_id=inc.id) if e.result == "approved"]
        assert [(e.detail["all"], e.detail["approved_by"]) for e in rows] == [(True, "admin")] * 2
        await await_for(lambda: inc.state == "mitigated", what="outlets switched")
        assert await states(3, 4) == [STATE_OFF, STATE_OFF]
        assert not model.nodes["node02"].powered and model.nodes["node01"].powered
        done = results(eng, kind="result", action="pdu_outlet", incident_id=inc.id)
        switched = [(d.result, d.detail["before"]["on"], d.detail["after"]["on"]) for d in done]
        assert switched == [("done", True, False)] * 2
        eng.clear("NodePowerOff", {"node": "node02"})
        await await_for(lambda: model.nodes["node02"].powered, what="outlets back on")
        assert await states(3, 4) == [STATE_ON, STATE_ON]
        assert sorted(results_of(eng, "pdu_outlet")) == ["done", "done", "undone", "undone"]
        assert first.state == "resolved"
        await runner.cleanup()
        await eng.stop()
        await dev.stop()
    asyncio.run(main())


# -- exec and notify ---------------------------------------------------------------------

RECORDER = textwrap.dedent("""\
    import json, os, sys
    with open(os.environ.get("RECORD_TO", {out!r}), "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\\n")
""")

MAINTENANCE = {"name": "node-maintenance", "trigger": {"alertname": "NodeMaintenance"}, "steps": [
    {"action": "notify", "targets": "none", "params": {"message": "maintenance"}},
    {"action": "exec", "targets": "nodes",
     "params": {"program": "record", "args": ["--node", "{node}", "--incident", "{incident_id}"],
                "undo_args": ["--undo", "{node}"]}},
    {"action": "exec", "targets": "nodes", "params": {"program": "record", "args": ["{summary}"]}},
    {"action": "exec", "targets": "nodes", "params": {"program": "sh", "args": ["-c", "touch {node}"]}},
]}


def test_exec_runs_only_allow_listed_programs_with_inventory_arguments_and_notify_posts(tmp_path):
    async def main():
        out = tmp_path / "argv.log"
        prog = tmp_path / "record"
        prog.write_text(f"#!{sys.executable}\n" + RECORDER.format(out=str(out)))
        prog.chmod(0o755)
        posts: list[dict] = []

        async def hook(request: web.Request) -> web.Response:
            posts.append(await request.json())
            return web.json_response({}, status=503 if len(posts) == 1 else 200)  # the first try fails

        app = web.Application()
        app.router.add_post("/events", hook)
        nrunner = web.AppRunner(app)
        await nrunner.setup()
        nport = free_port()
        await web.TCPSite(nrunner, "127.0.0.1", nport).start()
        eng = wired(config(tmp_path, {}, {
            "playbook_dir": playbook_dir(tmp_path, MAINTENANCE), "notify_url": f"http://127.0.0.1:{nport}/events",
            "exec_allow": {"record": {"path": str(prog), "undo_path": str(prog), "timeout_seconds": 10}}}))
        await eng.start()
        runner, url, _ = await serve(eng)
        hostile = "$(touch /tmp/pwned); rm -rf / `id`"
        a = alert(node="node02", name="NodeMaintenance", fp="m1", annotations={"summary": hostile})
        a["labels"]["instance"] = hostile
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/api/v1/alerts", json=payload(a), headers=HOOK_AUTH) as r:
                assert r.status == 200
        inc = await await_for(lambda: eng.incidents.find("NodeMaintenance", {"node": "node02"}), what="incident")
        # partial, not mitigated: the `sh` step is refused (not allow-listed), truthfully not an effect
        await await_for(lambda: inc.state == "partial", what="playbook ran")
        # notify: a JSON event on a real server, retried after the 503 within the attempt budget
        assert len(posts) == 2 and posts[0] == posts[1]
        assert posts[1]["message"] == "maintenance" and posts[1]["incident_id"] == inc.id
        assert posts[1]["node"] == "node02" and posts[1]["detector"] == "NodeMaintenance"
        assert results_of(eng, "notify") == ["done"]
        # exec: one argument list, values from the inventory-checked targets, never from the payload
        argvs = [json.loads(line) for line in out.read_text().splitlines()]
        assert argvs == [["--node", "node02", "--incident", inc.id]]
        assert sorted(g for _, g in blocked(eng, "exec")) == ["exec_allow", "exec_args"]
        reasons = " ".join(e.detail["why"] for e in results(eng, kind="blocked", action="exec"))
        assert "'sh' not in remediation.exec_allow" in reasons and "{summary} is not allowed" in reasons
        assert not Path("/tmp/pwned").exists() and not (Path.cwd() / "node02").exists()
        # resolve: the allow-listed undo program runs with its own argument list
        eng.clear("NodeMaintenance", {"node": "node02"})
        await await_for(lambda: len(out.read_text().splitlines()) == 2, what="undo program ran")
        assert json.loads(out.read_text().splitlines()[1]) == ["--undo", "node02"]
        await await_for(lambda: "undone" in results_of(eng, "exec"), what="undo journaled")
        await runner.cleanup()
        await eng.stop()
        await nrunner.cleanup()
    asyncio.run(main())


# -- crash safety of a power cap -----------------------------------------------------------

CHILD = textwrap.dedent("""\
    import asyncio, sys
    sys.path[:0] = [{repo!r}]
    from agent.config import parse_config
    from agent.remediation.wiring import build_engine
    async def main():
        eng = build_engine(parse_config({cfg!r}))
        await eng.start()
        eng.fire("gpu_thermal", {{"node": "node01", "gpu": "1"}}, "warning")
        await asyncio.sleep(120)  # killed long before
    asyncio.run(main())
""")


class HoldAfterSet:
    """Middleware: lets a power-limit POST take effect in the model, then holds the answer while `hold` is set.
    With `journal`, it also reads which intents that file holds on disk the moment each write arrives."""

    def __init__(self, journal: Path | None = None):
        self.sets: list[int] = []
        self.hold = True
        self.released = threading.Event()
        self.journal = journal
        self.intents_on_disk_at_set: list[list[str]] = []

    def _intents_on_disk(self) -> list[str]:
        db = sqlite3.connect(f"file:{self.journal}?mode=ro", uri=True)
        try:
            return [r[0] for r in db.execute("SELECT action FROM journal WHERE kind = 'intent' ORDER BY seq")]
        finally:
            db.close()

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        resp = await handler(request)
        if request.method == "POST" and request.path.endswith("/power-limit"):
            if self.journal is not None:
                self.intents_on_disk_at_set.append(await asyncio.to_thread(self._intents_on_disk))
            self.sets.append(int(request.match_info["index"]))
            if self.hold:
                await asyncio.to_thread(self.released.wait, 30)
        return resp


def test_sigkill_between_power_cap_intent_and_result(tmp_path):
    model = RackModel(nodes=2, gpus_per_node=2)
    model.set_power_limit("node01", 1, 650_000)  # the limit undo must restore (not the 700 W default)
    gate = HoldAfterSet(journal=tmp_path / "journal.db")
    srv = NvmlSimServer(model, middlewares=(gate.middleware,)).start()
    cfg = config(tmp_path, {}, sources={"nvml": {"backend": "sim", "sim_url": srv.url}})
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(repo=str(REPO), cfg=cfg)])
    try:
        wait_for(lambda: gate.sets, timeout=30, what="power limit set by the child")
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
        # ordering, not luck: the intent was committed before the write reached the device
        assert gate.intents_on_disk_at_set == [["gpu_power_cap"]]
        assert model.gpu("node01", 1).power_limit_mw == 525_000  # 75 % of 700 W took effect, unjournaled
        gate.hold = False
        gate.released.set()

        async def restart():
            eng = wired(cfg)
            (intent,) = eng.journal.unfinished_intents()
            assert intent.action == "gpu_power_cap" and intent.detail["plan"]["before"]["limit_watts"] == 650.0
            await eng.start()
            assert not eng.journal.unfinished_intents()
            rec = results(eng, kind="result", action="gpu_power_cap")
            assert [(r.result, r.detail["reconciled"]) for r in rec] == [("done", "applied")]
            inc = eng.incidents.find("gpu_thermal", {"node": "node01", "gpu": "1"})
            assert inc is not None
            await await_for(lambda: inc.state == "mitigated", what="restored incident mitigated")
            eng.fire("gpu_thermal", {"node": "node01", "gpu": "1"}, "warning")  # re-fired: changes nothing
            assert gate.sets == [1] and model.gpu("node01", 1).power_limit_mw == 525_000
            eng.clear("gpu_thermal", {"node": "node01", "gpu": "1"})
            await await_for(lambda: model.gpu("node01", 1).power_limit_mw == 650_000, what="recorded limit restored")
            await await_for(lambda: results_of(eng, "gpu_power_cap") == ["done", "undone"], what="undo journaled")
            assert gate.sets == [1, 1] and model.gpu("node01", 0).power_limit_mw == 700_000
            await eng.stop()
        asyncio.run(restart())
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
        gate.released.set()
        srv.stop()
