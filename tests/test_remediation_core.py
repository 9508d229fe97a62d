"""Detectors, incidents, journal, playbooks, guardrails and the collector (simulated scheduler, no devices)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from prometheus_client import CollectorRegistry

from sim.scheduler import SimulatedScheduler
from agent.remediation.detectors import Context, Detectors
from agent.remediation.engine import Executors
from agent.remediation.journal import Journal
from agent.remediation.playbooks import PlaybookError, load_playbooks
from agent.remediation.settings import DetectorSettings
from exporters.model import Quality

from tests.helpers import await_for
from tests.remediation_support import engine, inventory, reading, results, snap


def test_journal_is_append_only(tmp_path):
    j = Journal(tmp_path / "j.db")
    seq = j.append("intent", action_id="a1", target="node=n1")
    j.append("result", action_id="a1", result="done")
    assert [e.kind for e in j.entries()] == ["intent", "result"]  # queued rows are read too
    assert j.flush() and j.pending == 0  # committed by the writer thread
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        j._db.execute("UPDATE journal SET result='x' WHERE seq=?", (seq,))
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        j._db.execute("DELETE FROM journal")
    assert j._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert j.record_alert("fp", "t0", "firing") and not j.record_alert("fp", "t0", "firing")


def test_leak_needs_two_consecutive_polls_and_sensor_fault_never_fires_leak():
    d = Detectors(DetectorSettings(), Context(node="node01", rack="r01"))
    wet = lambda ts, q=Quality.OK: reading("supernode_leak_detected", 1, ts, q, zone="zone-a", sensor="s1")
    assert d.evaluate(snap(wet(1.0), at=1.0)) == []
    # the same sample again (another source published) is not a second poll
    assert d.evaluate(snap(wet(1.0), at=1.1)) == []
    events = d.evaluate(snap(wet(1.5), at=1.5))
    assert [(e.kind, e.detector, e.targets) for e in events] == [("fire", "leak", {"zone": "zone-a"})]
    d2 = Detectors(DetectorSettings(), Context(node="node01", rack="r01"))
    faulty = [d2.evaluate(snap(wet(t, Quality.SENSOR_FAULT), at=t)) for t in (1.0, 1.5, 2.0)]
    kinds = {(e.kind, e.detector) for evs in faulty for e in evs}
    assert ("fire", "leak") not in kinds
    assert ("fire", "leak_sensor_fault") in kinds and ("fire", "sensor_fault") in kinds


def test_flow_low_hysteresis_and_hold_times():
    s = DetectorSettings(nominal_flow_cubic_meters_per_second=0.005,
                         coolant_flow_low={"fire_seconds": 1.0, "clear_seconds": 2.0})
    d = Detectors(s, Context(node="node01", rack="r01"))
    flow = lambda v, t: snap(reading("supernode_cdu_flow_cubic_meters_per_second", v, t, cdu="cdu1", loop="secondary"), at=t)
    assert d.evaluate(flow(0.003, 0.0)) == []          # 60 %: below 70 %, hold not yet met
    assert [e.kind for e in d.evaluate(flow(0.003, 1.2))] == ["fire"]
    assert d.evaluate(flow(0.004, 5.0)) == []          # 80 %: between set and clear thresholds: stays
    assert d.evaluate(flow(0.0045, 6.0)) == []         # 90 %: clear condition, hold starts
    assert [e.kind for e in d.evaluate(flow(0.0045, 8.5))] == ["clear"]


def test_an_xid_fires_the_ladder_detector_of_its_catalogue_class_on_a_new_event_only():
    d = Detectors(DetectorSettings(), Context(node="node01", rack="r01"))
    x = lambda xid, v, t, gpu="0": reading("supernode_gpu_xid_errors_total", v, t, gpu=gpu, uuid="u" + gpu, xid=str(xid))
    ev = d.evaluate(snap(x(13, 1, 1.0), at=1.0))  # RESTART_APP: the job is told, the node is not drained
    assert [(e.kind, e.detector, e.targets, e.severity) for e in ev] == [
        ("fire", "gpu_app_fault", {"node": "node01", "gpu": "0"}, "warning")]
    assert ev[0].detail["mnemonic"].startswith("ROBUST_CHANNEL_GR") and ev[0].detail["immediate_action"] == "RESTART_APP"
    assert d.evaluate(snap(x(13, 1, 1.0), at=1.5)) == []  # the same sample again is no new XID
    ev = d.evaluate(snap(x(13, 1, 1.0), x(79, 1, 2.0, gpu="1"), at=2.0))  # fallen off the bus: RESTART_BM
    assert [(e.detector, e.targets) for e in ev] == [("gpu_reboot_required", {"node": "node01"})]
    assert ev[0].detail["gpus"][0]["xid"] == 79 and ev[0].detail["gpus"][0]["rule"] == "catalogue"


def test_gpu_thermal_near_slowdown():
    d = Detectors(DetectorSettings(gpu_thermal={"fire_seconds": 0, "clear_seconds": 0}), Context(node="n1", rack="r"))
    def s(temp, t):
        return snap(reading("supernode_gpu_temperature_celsius", temp, t, gpu="2", uuid="u", sensor="gpu"),
                    reading("supernode_gpu_temperature_threshold_celsius", 87, t, gpu="2", uuid="u", threshold="slowdown"), at=t)
    assert d.evaluate(s(80, 1)) == []
    assert [(e.kind, e.targets) for e in d.evaluate(s(85, 2))] == [("fire", {"node": "n1", "gpu": "2"})]
    assert d.evaluate(s(82, 3)) == []  # within the clear margin band: stays
    assert [e.kind for e in d.evaluate(s(79, 4))] == ["clear"]


def test_shipped_playbooks_load_and_bad_playbook_names_field(tmp_path):
    names = {b.name for b in load_playbooks()}
    assert {"leak-response", "coolant-degraded", "gpu-thermal", "gpu-reset", "gpu-reboot", "gpu-service",
            "gpu-app-fault", "gpu-lost", "nvlink-errors", "optic-degraded", "rack-power-over-budget"} <= names
    (tmp_path / "bad.yaml").write_text("name: x\ntrigger: {detector: leak}\nsteps: [{action: reboot}]\n")
    with pytest.raises(PlaybookError, match="steps.0.action"):
        load_playbooks(tmp_path)


def _xid_incident(eng, node="node01"):
    # An XID on another node reaches this agent only through Alertmanager (local detectors see local GPUs).
    source = "local" if node == eng.identity.node else "alertmanager"
    return eng.fire("gpu_lost", {"node": node}, "critical", source=source)


def test_incident_refire_runs_playbook_once_and_resolve_undoes(tmp_path):
    async def main():
        sched = SimulatedScheduler(["node01", "node02"])
        eng = engine(tmp_path, executors=Executors(scheduler=sched), max_drained_fraction=1.0)
        await eng.start()
        inc = _xid_incident(eng)
        for _ in range(4):
            assert _xid_incident(eng) is inc
        await await_for(lambda: inc.state == "mitigated", what="mitigated")
        assert (await sched.state("node01")).reason.startswith("supernode-agent:")
        assert len([e for e in results(eng, kind="intent", action="drain")]) == 1
        eng.clear("gpu_lost", {"node": "node01"})
        await await_for(lambda: sched.nodes["node01"].state == "idle", what="resumed")
        assert inc.state == "resolved" and inc.resolved_at >= inc.opened_at
        reg = CollectorRegistry()
        reg.register(eng.collector())
        assert reg.get_sample_value("supernode_incidents_total", {"detector": "gpu_lost", "severity": "critical"}) == 1
        assert reg.get_sample_value("supernode_incident_duration_seconds_count", {"detector": "gpu_lost"}) == 1
        assert reg.get_sample_value("supernode_remediation_actions_total",
                                    {"playbook": "gpu-lost", "action": "drain", "result": "undone"}) == 1
        assert reg.get_sample_value("supernode_remediation_mode", {"mode": "enforce"}) == 1
        await eng.stop()
    asyncio.run(main())


def test_ownership_never_resumes_a_node_drained_by_a_person(tmp_path):
    async def main():
        sched = SimulatedScheduler(["node01", "node02"])
        await sched.drain("node01", "maintenance by alice")
        eng = engine(tmp_path, executors=Executors(scheduler=sched), max_drained_fraction=1.0)
        await eng.start()
        inc = _xid_incident(eng)
        await await_for(lambda: inc.state == "mitigated")
        eng.clear("gpu_lost", {"node": "node01"})
        await await_for(lambda: inc.state == "resolved" and not eng.tasks)
        assert sched.nodes["node01"].state == "drained" and sched.nodes["node01"].reason == "maintenance by alice"
        await eng.stop()
    asyncio.run(main())


def _blocked(eng, guardrail):
    reg = CollectorRegistry()
    reg.register(eng.collector())
    rows = [e for e in eng.journal.entries() if e.kind == "blocked" and e.detail.get("guardrail") == guardrail]
    return rows, reg.get_sample_value("supernode_remediation_blocked_total",
                                      {"playbook": "gpu-lost", "guardrail": guardrail})


@pytest.mark.parametrize("mode", ["observe", "dry-run"])
def test_mode_observe_and_dry_run_do_not_act(tmp_path, mode):
    async def main():
        sched = SimulatedScheduler(["node01", "node02"])
        eng = engine(tmp_path, mode=mode, executors=Executors(scheduler=sched), max_drained_fraction=1.0)
        await eng.start()
        inc = _xid_incident(eng)
        await await_for(lambda: inc.state == "observed")  # never "mitigated": nothing was done
        assert inc.mitigated_at is None and sched.nodes["node01"].state == "idle"
        if mode == "observe":
            rows, n = _blocked(eng, "mode")
            assert rows and n == 1  # drain
            assert not _blocked(eng, "not_configured")[0]  # notify without a URL is not a block...
            assert [e.result for e in results(eng, kind="result", action="notify")] == ["not_configured"]
        else:
            assert [e.result for e in results(eng, kind="result", action="drain")] == ["dry_run"]
            assert not results(eng, kind="intent")
        await eng.stop()
    asyncio.run(main())


def test_blast_radius_counts_scheduler_state(tmp_path):
    async def main():
        sched = SimulatedScheduler(["node01", "node02", "node03", "node04"])
        await sched.drain("node03", "someone")  # a person's drain counts too
        eng = engine(tmp_path, executors=Executors(scheduler=sched),
                     inv=inventory(nodes=("node01", "node02", "node03", "node04")),
                     max_drained_nodes=2, max_drained_fraction=1.0)
        await eng.start()
        a, b = _xid_incident(eng, "node01"), _xid_incident(eng, "node02")
        await await_for(lambda: {a.state, b.state} == {"mitigated", "failed"})  # one drain blocked: failed
        drained = sorted(n for n, s in sched.nodes.items() if s.drained)
        assert len(drained) == 2 and "node03" in drained
        rows, n = _blocked(eng, "blast_radius")
        assert len(rows) == 1 and n == 1
        await eng.stop()
    asyncio.run(main())


def test_circuit_breaker_stays_open_until_reset_and_undo_still_runs(tmp_path):
    async def main():
        sched = SimulatedScheduler([f"node{i:02d}" for i in range(1, 7)])
        inv = inventory(nodes=[f"node{i:02d}" for i in range(1, 7)])
        eng = engine(tmp_path, executors=Executors(scheduler=sched), inv=inv, breaker_max_actions=1,
                     max_drained_nodes=10, max_drained_fraction=1.0)
        await eng.start()
        a = _xid_incident(eng, "node01")
        await await_for(lambda: a.state == "mitigated")
        assert eng.guard.breaker_open  # the drain was the one action the window allows
        b = _xid_incident(eng, "node02")
        await await_for(lambda: b.state == "failed")  # its drain was blocked: not mitigated
        assert sched.nodes["node02"].state == "idle"
        rows, n = _blocked(eng, "circuit_breaker")
        assert rows and n >= 1
        eng.clear("gpu_lost", {"node": "node01"})  # undo proceeds while open
        await await_for(lambda: sched.nodes["node01"].state == "idle", what="undo while breaker open")
        assert eng.guard.breaker_open
        eng.reset_breaker("test")
        c = _xid_incident(eng, "node03")
        await await_for(lambda: c.state == "mitigated")
        assert sched.nodes["node03"].drained
        await eng.stop()
    asyncio.run(main())


def test_rate_limit_and_cooldown(tmp_path):
    async def main():
        sched = SimulatedScheduler(["node01", "node02", "node03"])
        inv = inventory(nodes=["node01", "node02", "node03"])
        eng = engine(tmp_path, executors=Executors(scheduler=sched), inv=inv, rate_per_hour={"drain": 1, "default": 60},
                     max_drained_nodes=10, max_drained_fraction=1.0)
        await eng.start()
        a = _xid_incident(eng, "node01")
        await await_for(lambda: a.state == "mitigated")
        b = _xid_incident(eng, "node02")
        await await_for(lambda: b.state == "failed")
        assert sched.nodes["node02"].state == "idle" and _blocked(eng, "rate_limit")[1] == 1
        await eng.stop()
        eng2 = engine(tmp_path / "2", executors=Executors(scheduler=sched), inv=inv, cooldown_seconds=3600,
                      max_drained_nodes=10, max_drained_fraction=1.0)
        await eng2.start()
        c = eng2.fire("gpu_lost", {"node": "node03", "gpu": "1"}, "critical", source="alertmanager")
        await await_for(lambda: c.state == "mitigated")
        eng2.clear("gpu_lost", {"node": "node03", "gpu": "1"})
        await await_for(lambda: sched.nodes["node03"].state == "idle")
        d = eng2.fire("gpu_lost", {"node": "node03", "gpu": "2"}, "critical", source="alertmanager")
        await await_for(lambda: d.state == "failed")  # cooldown blocked the drain
        assert sched.nodes["node03"].state == "idle"
        assert [e for e in eng2.journal.entries() if e.kind == "blocked" and e.detail.get("guardrail") == "cooldown"]
        await eng2.stop()
    asyncio.run(main())


def test_attempt_budget_then_escalated(tmp_path):
    class Broken(SimulatedScheduler):
        calls = 0

        async def drain(self, node, reason):
            Broken.calls += 1
            raise __import__("agent.remediation.actions.slurm", fromlist=["x"]).SchedulerError("slurmctld down")

    async def main():
        sched = Broken(["node01", "node02"])
        eng = engine(tmp_path, executors=Executors(scheduler=sched), attempts_per_incident=3, max_drained_fraction=1.0)
        await eng.start()
        inc = _xid_incident(eng)
        await await_for(lambda: inc.state == "failed")  # three failed drains are not a mitigation
        assert Broken.calls == 3
        res = results(eng, kind="result", action="drain")
        assert [r.result for r in res] == ["failed"] and res[0].detail["escalated"]
        await eng.stop()
    asyncio.run(main())
