"""The GPU fault judge (agent/remediation/gpu_faults.py) and its data (exporters/profiles/nvml/xid-recovery.yaml).

Every rule over time runs on a deterministic clock: the test moves it. The recovery ledger is the engine's own
class, filled here as the step runner fills it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.remediation.detectors import Context, Detectors
from agent.remediation.gpu_faults import GpuFaultJudge, GpuReadings
from agent.remediation.recovery_ledger import Recovery, RecoveryLedger
from agent.remediation.settings import DetectorSettings, XidOverride
from agent.remediation.xid_recovery import DEFAULT_RULES, load_rules, shipped_rules
from agent.snapshot import Snapshot
from exporters.errors import ProfileError
from exporters.gpu.nvml_profile import load_profile
from exporters.gpu.xid_catalogue import load_catalogue_file
from exporters.model import Quality, Reading, counter, gauge, info

N = "node01"


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def judge(clock: Clock, ledger: RecoveryLedger | None = None, **overrides: XidOverride) -> GpuFaultJudge:
    rules, catalogue = shipped_rules()
    return GpuFaultJudge(rules, catalogue, ledger or RecoveryLedger(), clock,
                         {int(k.removeprefix("x")): v for k, v in overrides.items()}, app_hold_seconds=60.0)


def xid(j: GpuFaultJudge, code: int, gpu: str = "0", n: int = 1, **more) -> set:
    return j.update(GpuReadings(xids=[(N, gpu, code, n)], **more))


def klass(j: GpuFaultJudge, gpu: str = "0") -> str | None:
    return j.klass((N, gpu))


# ---- the data ----------------------------------------------------------------------------------------------

def test_every_catalogue_immediate_action_and_every_entry_without_one_has_a_class():
    """A catalogue update that adds an immediate action (or an XID without one) fails here until it has a class."""
    rules, catalogue = load_rules(), load_catalogue_file()
    assert catalogue.immediate_actions() <= set(rules.immediate_actions), \
        sorted(catalogue.immediate_actions() - set(rules.immediate_actions))
    no_bucket = {e.code for e in catalogue.xids if e.immediate_action is None}
    assert no_bucket == set(rules.no_bucket), sorted(no_bucket ^ set(rules.no_bucket))
    assert set(rules.immediate_actions) <= catalogue.immediate_actions(), "a class for an action the catalogue lacks"
    # every XID a rule names is one the catalogue knows; `driver` only where the catalogue says XID_154
    known = {e.code for e in catalogue.xids}
    assert all(set(r.xids) <= known for r in rules.repeats)
    assert [a for a, m in rules.immediate_actions.items() if m.klass == "driver"] == ["XID_154"]


def test_every_nvml_recovery_action_has_a_class():
    labels = {a.label for a in load_profile().recovery_actions} - {"none"}
    assert labels == set(load_rules().recovery_actions), sorted(labels ^ set(load_rules().recovery_actions))


def test_a_bad_rules_file_names_the_file_and_the_field(tmp_path: Path):
    text = DEFAULT_RULES.read_text().replace("RESET_GPU: {class: reset", "RESET_GPU: {class: rest")
    bad = tmp_path / "xid-recovery.yaml"
    bad.write_text(text)
    with pytest.raises(ProfileError) as err:
        load_rules(bad)
    assert str(bad) in str(err.value) and "immediate_actions.RESET_GPU.class" in str(err.value), str(err.value)
    bad.write_text(DEFAULT_RULES.read_text().replace("    count: 5\n", "    count: 5\n    cuont: 1\n", 1))
    with pytest.raises(ProfileError, match=r"repeats\.0\.cuont"):
        load_rules(bad)


# ---- single XIDs by the catalogue -----------------------------------------------------------------------------

def test_catalogue_classes_of_single_xids():
    clock = Clock()
    j = judge(clock)
    assert xid(j, 13, "0") == {(N, "0")} and klass(j, "0") == "app"
    xid(j, 48, "1")
    assert klass(j, "1") == "reset"
    xid(j, 79, "2")
    assert klass(j, "2") == "reboot"
    xid(j, 74, "3")  # WORKFLOW_NVLINK_ERR: reset (see the YAML)
    assert klass(j, "3") == "reset"
    xid(j, 63, "4")  # IGNORE: counted, no fault
    assert klass(j, "4") is None and j.view()[f"{N}/4"]["last_xid"]["code"] == 63
    xid(j, 999, "5")  # not in the catalogue: told to a person, no drain
    assert klass(j, "5") == "app" and j.faults()[(N, "5")].rule == "unknown_xid"
    f = j.faults()[(N, "2")]
    assert (f.rule, f.entry["mnemonic"], f.entry["immediate_action"]) == (
        "catalogue", "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM")


def test_app_is_an_event_that_lapses_after_its_hold_and_never_lowers_a_higher_fault():
    clock = Clock()
    j = judge(clock)
    xid(j, 13)
    clock.t += 59
    j.update(GpuReadings())
    assert klass(j) == "app"
    clock.t += 2
    j.update(GpuReadings())
    assert klass(j) is None
    xid(j, 48)
    assert xid(j, 13) == set() and klass(j) == "reset"  # a later app XID does not lower it (and is no app event)


def test_overrides_replace_one_entry_before_the_class_is_looked_up():
    clock = Clock()
    j = judge(clock, x13=XidOverride(immediate_action="RESET_GPU"),
              x79=XidOverride(investigatory_action="IGNORE"))
    xid(j, 13)
    assert klass(j) == "reset" and j.faults()[(N, "0")].rule == "override"
    xid(j, 79, "1")  # only the investigatory action replaced: the immediate one (RESTART_BM) still decides
    f = j.faults()[(N, "1")]
    assert (f.klass, f.entry["investigatory_action"], f.entry["immediate_action"]) == ("reboot", "IGNORE", "RESTART_BM")


# ---- rules over time and scope ----------------------------------------------------------------------------------

def test_five_app_xids_on_one_gpu_within_the_window_mean_the_gpu_and_expiry_forgets_them():
    clock = Clock()
    j = judge(clock)
    for _ in range(4):
        xid(j, 13)
        clock.t += 600
    assert klass(j) == "app"
    xid(j, 13)  # the fifth within 3600 s (at +2400 s)
    f = j.faults()[(N, "0")]
    assert (f.klass, f.rule, f.evidence["count"], f.evidence["window_seconds"]) == (
        "service", "app_repeat_same_gpu", 5, 3600.0)
    assert "diagnostics" in f.why
    # the same count spread over more than the window: each old one has left it
    clock2 = Clock()
    k = judge(clock2)
    for _ in range(5):
        xid(k, 31)
        clock2.t += 1000
    assert klass(k) == "app"


def test_the_same_xid_on_several_gpus_stays_app_and_says_so():
    clock = Clock()
    j = judge(clock)
    xid(j, 13, "1")
    clock.t += 10
    xid(j, 13, "0", n=5)  # five on GPU 0, but GPU 1 had it too within 300 s: the job, not GPU 0
    f = j.faults()[(N, "0")]
    assert (f.klass, f.rule, f.evidence["gpus"]) == ("app", "same_xid_several_gpus", ["0", "1"])
    assert "software or the job" in f.why
    clock.t += 301  # GPU 1's is out of the spread window now: five more on GPU 0 alone are the GPU
    xid(j, 13, "0", n=5)
    assert klass(j, "0") == "service"
    # both in one snapshot, whichever GPU the readings list first: the job
    for order in ([(N, "0", 31, 5), (N, "1", 31, 1)], [(N, "1", 31, 1), (N, "0", 31, 5)]):
        k = judge(Clock())
        k.update(GpuReadings(xids=order))
        assert (klass(k, "0"), k.faults()[(N, "0")].rule) == ("app", "same_xid_several_gpus"), order


def test_xid_48_five_times_in_24h_is_service_although_each_reset_succeeded():
    clock = Clock()
    ledger = RecoveryLedger()
    j = judge(clock, ledger)
    for i in range(4):
        xid(j, 48)
        assert klass(j) == "reset", i
        clock.t += 3600
        ledger.record(Recovery(N, "0", "gpu_reset", True, clock.t))
        j.update(GpuReadings())
        assert klass(j) is None, i
    xid(j, 48)
    f = j.faults()[(N, "0")]
    assert (f.klass, f.rule, f.evidence["count"]) == ("service", "dbe_repeat", 5)


# ---- the driver's verdict, XID 154 and row remap -----------------------------------------------------------------

def test_the_drivers_held_verdict_keeps_the_fault_at_least_at_its_class():
    clock = Clock()
    ledger = RecoveryLedger()
    j = judge(clock, ledger)
    held = {(N, "0"): ("gpu_reset", clock.t)}
    xid(j, 13, verdicts=held)
    assert klass(j) == "reset" and j.faults()[(N, "0")].rule == "driver_recovery_action"
    clock.t += 100  # the app hold has long passed: the verdict still holds it
    j.update(GpuReadings(verdicts={(N, "0"): ("gpu_reset", clock.t)}))
    assert klass(j) == "reset"
    clock.t += 1
    ledger.record(Recovery(N, "0", "gpu_reset", True, clock.t))
    # a reading taken before the reset still says gpu_reset: stale, it says nothing now
    j.update(GpuReadings(verdicts={(N, "0"): ("gpu_reset", clock.t - 0.5)}))
    j.update(GpuReadings(verdicts={(N, "0"): ("gpu_reset", clock.t - 0.5)}))
    assert klass(j) is None
    clock.t += 5  # the driver says it again after the reset: a new fault
    j.update(GpuReadings(verdicts={(N, "0"): ("node_reboot", clock.t)}))
    assert klass(j) == "reboot"


def test_xid_154_follows_the_drivers_recovery_action():
    clock = Clock()
    j = judge(clock)
    xid(j, 154, "0", verdicts={(N, "0"): ("node_reboot", clock.t)})
    f = j.faults()[(N, "0")]
    assert (f.klass, f.rule, f.evidence["recovery_action"]) == ("reboot", "xid154_driver_verdict", "node_reboot")
    xid(j, 154, "1")  # the driver's verdict reads none: the other XID decides
    assert klass(j, "1") is None


def test_row_remap_pending_asks_for_a_reset_and_a_failure_for_service():
    clock = Clock()
    ledger = RecoveryLedger()
    j = judge(clock, ledger)
    j.update(GpuReadings(remap_pending={(N, "0"): clock.t}, remap_failure={(N, "1"): clock.t}))
    assert (klass(j, "0"), j.faults()[(N, "0")].rule) == ("reset", "row_remap_pending")
    assert (klass(j, "1"), j.faults()[(N, "1")].rule) == ("service", "row_remap_failure")
    clock.t += 10
    ledger.record(Recovery(N, "0", "gpu_reset", True, clock.t))
    ledger.record(Recovery(N, None, "node_reboot", True, clock.t))
    clock.t += 1
    j.update(GpuReadings(remap_failure={(N, "1"): clock.t}))  # the remap applied at the reset: pending reads 0
    assert klass(j, "0") is None and klass(j, "1") == "service"  # a reset or reboot never clears service


# ---- the ladder: proven recovery, escalation ---------------------------------------------------------------------

def test_a_recovery_clears_only_if_recorded_after_the_fault_and_covering_its_class():
    clock = Clock()
    ledger = RecoveryLedger()
    j = judge(clock, ledger)
    ledger.record(Recovery(N, "0", "gpu_reset", True, clock.t - 5))  # before the fault: proves nothing
    xid(j, 48)
    ledger.record(Recovery(N, "0", "gpu_reset", True, clock.t))  # at the same instant: not proven after it
    j.update(GpuReadings())
    assert klass(j) == "reset"
    xid(j, 79, "1")
    clock.t += 30
    ledger.record(Recovery(N, "1", "gpu_reset", True, clock.t))  # a reset does not cover a reboot-class fault
    ledger.record(Recovery(N, "2", "gpu_reset", True, clock.t))  # nor another GPU's
    j.update(GpuReadings())
    assert (klass(j, "0"), klass(j, "1")) == ("reset", "reboot")
    ledger.record(Recovery(N, None, "node_reboot", True, clock.t + 1))  # a reboot covers every GPU of its node
    j.update(GpuReadings())
    assert j.faults() == {}
    assert j.view()[f"{N}/1"]["last_recovery"]["action"] == "node_reboot"


def test_a_failed_reset_escalates_to_reboot_and_a_failed_reboot_to_service():
    clock = Clock()
    ledger = RecoveryLedger()
    j = judge(clock, ledger)
    xid(j, 95)  # uncontained error: RESET_GPU
    clock.t += 10
    ledger.record(Recovery(N, "0", "gpu_reset", False, clock.t, "fault still read after the reset"))
    j.update(GpuReadings())
    f = j.faults()[(N, "0")]
    assert (f.klass, f.rule, f.xid, f.evidence["recovery"]["why"]) == (
        "reboot", "reset_failed", 95, "fault still read after the reset")
    clock.t += 10
    ledger.record(Recovery(N, None, "node_reboot", False, clock.t, "node did not come back"))
    j.update(GpuReadings())
    assert (klass(j), j.faults()[(N, "0")].rule) == ("service", "reboot_failed")
    assert j.node_fault(N).klass == "service"


def test_service_clears_only_after_the_gpu_left_the_bus_and_came_back_or_was_swapped():
    clock = Clock()
    ledger = RecoveryLedger()
    j = judge(clock, ledger)
    j.update(GpuReadings(up={(N, "0"): (True, "GPU-a"), (N, "1"): (True, "GPU-b")}))
    xid(j, 13, "0", n=5)
    xid(j, 13, "1", n=1)  # (GPU 1 only later: GPU 0 alone first, so service)
    assert klass(j, "0") == "service"
    clock.t += 86400
    j.update(GpuReadings(up={(N, "0"): (True, "GPU-a")}))
    assert klass(j, "0") == "service"  # time alone never clears it
    j.update(GpuReadings(up={(N, "0"): (False, "GPU-a")}))  # a person took it out
    j.update(GpuReadings(up={(N, "0"): (True, "GPU-a")}))
    assert klass(j, "0") is None
    j.update(GpuReadings(remap_failure={(N, "1"): clock.t}))
    j.update(GpuReadings(up={(N, "1"): (True, "GPU-new")}, remap_failure={}))  # a new board answers
    assert klass(j, "1") is None


def test_an_xid_storm_keeps_memory_bounded():
    clock = Clock()
    j = judge(clock)
    for i in range(2000):
        clock.t += 0.01
        xid(j, 13 if i % 2 else 43, n=1000)
    cap = shipped_rules()[0].max_events_per_gpu
    assert len(j.gpus[(N, "0")].events) == cap
    assert klass(j) == "service"  # and the rule still decided from what it kept


def test_a_restored_incident_holds_its_fault_until_proven():
    clock = Clock()
    ledger = RecoveryLedger()
    j = judge(clock, ledger)
    j.restore("reset", N, "3", clock.t - 100)
    j.update(GpuReadings())
    assert klass(j, "3") == "reset" and j.faults()[(N, "3")].rule == "restored"
    ledger.record(Recovery(N, "3", "gpu_reset", True, clock.t))
    j.update(GpuReadings())
    assert klass(j, "3") is None


# ---- the detectors over the judge ------------------------------------------------------------------------------

XID = counter("supernode_gpu_xid_errors_total", "x", ["gpu", "uuid", "xid", "action"])
REMAP_FAILURE = gauge("supernode_gpu_remapped_rows_failure", "x", ["gpu", "uuid"])
INFO = info("supernode_gpu_info", "x", ["gpu", "uuid", "name", "serial"])


def _snap(t: float, *readings: Reading) -> Snapshot:
    return Snapshot(t, tuple(readings), (), monotonic=t)


def test_detectors_fire_the_current_class_only_and_service_says_what_to_tell_the_vendor():
    clock = Clock(5000.0)
    ledger = RecoveryLedger()
    d = Detectors(DetectorSettings(), Context(node=N, rack="r01", recoveries=ledger), clock)
    serial = Reading(INFO, 1.0, {"gpu": "0", "uuid": "GPU-0", "name": "H100", "serial": "1650923000001"}, Quality.OK, 1.0)
    x48 = lambda n, t: Reading(XID, n, {"gpu": "0", "uuid": "GPU-0", "xid": "48", "action": "WORKFLOW_XID_48"},
                               Quality.OK, t)
    ev = d.evaluate(_snap(1.0, serial, x48(1, 1.0)))
    assert [(e.kind, e.detector, e.targets) for e in ev] == [("fire", "gpu_reset_required", {"node": N, "gpu": "0"})]
    assert ev[0].detail["rule"] == "catalogue" and ev[0].detail["investigatory_action"] == "WORKFLOW_XID_48"
    fail = Reading(REMAP_FAILURE, 1.0, {"gpu": "0", "uuid": "GPU-0"}, Quality.OK, 2.0)
    ev = d.evaluate(_snap(2.0, serial, x48(1, 1.0), fail))
    assert [(e.kind, e.detector) for e in ev] == [("fire", "gpu_service_required")]
    vendor = ev[0].detail["vendor"]
    assert vendor["serial"] == "1650923000001" and vendor["xid_history"][0]["xid"] == 48
    assert ev[0].detail["rule"] == "row_remap_failure"
    ev = d.evaluate(_snap(13.0, serial, x48(1, 1.0), fail))  # the reset class's condition is false: it clears
    assert [(e.kind, e.detector) for e in ev] == [("clear", "gpu_reset_required")]


# ---- the engine: overrides from config, the recommended-class metric, the view --------------------------------

def test_the_engine_judges_with_the_configs_overrides_and_exports_the_recommended_class(tmp_path):
    from prometheus_client import CollectorRegistry

    from agent.remediation.engine import RemediationEngine
    from agent.remediation.settings import RemediationSettings
    from tests.remediation_support import identity, inventory

    settings = RemediationSettings.model_validate({"xid_overrides": {79: {"immediate_action": "RESET_GPU"}}})
    eng = RemediationEngine(settings, "enforce", identity(), inventory(), tmp_path / "journal.db")
    judge_ = eng.detectors.gpu_faults
    judge_.update(GpuReadings(up={(N, "0"): (True, "GPU-0"), (N, "1"): (True, "GPU-1")}, xids=[(N, "1", 79, 1)]))
    assert judge_.klass((N, "1")) == "reset"  # RESTART_BM overridden: the class follows the override
    reg = CollectorRegistry()
    reg.register(eng.collector())
    value = lambda gpu, action: reg.get_sample_value("supernode_gpu_recovery_recommended",
                                                    {"node": N, "gpu": gpu, "action": action})
    assert [value("1", a) for a in ("app", "reset", "reboot", "service")] == [0, 1, 0, 0]
    assert [value("0", a) for a in ("app", "reset", "reboot", "service")] == [0, 0, 0, 0]
    assert eng._xid_active(N)  # the resume check holds the node while its fault is outstanding
    row = eng.gpu_faults_view()[f"{N}/1"]
    assert row["recommended"] == "reset" and row["rule"] == "override"
    assert row["last_xid"]["code"] == 79 and row["last_xid"]["mnemonic"] == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    eng.recoveries.record(Recovery(N, "1", "gpu_reset", True, eng.clock() + 1))
    judge_.clock = lambda: eng.clock() + 2
    judge_.update(GpuReadings())
    assert not eng._xid_active(N) and eng.gpu_faults_view()[f"{N}/1"]["last_recovery"]["ok"] is True
    assert value("1", "reset") == 0


def test_the_app_incident_clears_after_its_hold_and_the_reset_incident_only_after_a_proven_reset():
    clock = Clock(5000.0)
    ledger = RecoveryLedger()
    d = Detectors(DetectorSettings(), Context(node=N, rack="r01", recoveries=ledger), clock)
    x = lambda code, gpu, n, t: Reading(XID, n, {"gpu": gpu, "uuid": "GPU-" + gpu, "xid": str(code), "action": "a"},
                                        Quality.OK, t)
    ev = d.evaluate(_snap(1.0, x(13, "0", 1, 1.0), x(95, "1", 1, 1.0)))
    assert sorted((e.kind, e.detector, e.targets["gpu"]) for e in ev) == [
        ("fire", "gpu_app_fault", "0"), ("fire", "gpu_reset_required", "1")]
    clock.t += 1
    assert d.evaluate(_snap(2.0, x(13, "0", 1, 1.0), x(95, "1", 1, 1.0))) == []  # no new XID: the hold starts
    clock.t += 59
    assert d.evaluate(_snap(61.0, x(13, "0", 1, 1.0), x(95, "1", 1, 1.0))) == []  # held
    clock.t += 1.5
    ev = d.evaluate(_snap(62.5, x(13, "0", 1, 1.0), x(95, "1", 1, 1.0)))
    assert [(e.kind, e.detector) for e in ev] == [("clear", "gpu_app_fault")]  # the event's hold passed
    clock.t += 600
    assert d.evaluate(_snap(662.0, x(13, "0", 1, 1.0), x(95, "1", 1, 1.0))) == []  # time never clears a reset
    ledger.record(Recovery(N, "1", "gpu_reset", True, clock.t))
    clock.t += 1
    d.evaluate(_snap(663.0, x(13, "0", 1, 1.0), x(95, "1", 1, 1.0)))
    ev = d.evaluate(_snap(674.0, x(13, "0", 1, 1.0), x(95, "1", 1, 1.0)))
    assert [(e.kind, e.detector, e.targets) for e in ev] == [("clear", "gpu_reset_required", {"node": N, "gpu": "1"})]


def test_a_hang_is_no_service_visit():
    """A GPU that hangs reads up 0 too, but nobody took it out: its service fault stays when it answers again."""
    clock = Clock(5000.0)
    d = Detectors(DetectorSettings(), Context(node=N, rack="r01"), clock)
    up = gauge("supernode_gpu_up", "x", ["gpu", "uuid"])
    hung = gauge("supernode_gpu_hung", "x", ["gpu", "uuid"])
    lab = {"gpu": "0", "uuid": "GPU-0"}
    fail = Reading(REMAP_FAILURE, 1.0, lab, Quality.OK, 1.0)
    d.evaluate(_snap(1.0, fail, Reading(up, 1.0, lab, Quality.OK, 1.0)))
    assert d.gpu_faults.klass((N, "0")) == "service"
    d.evaluate(_snap(2.0, Reading(up, 0.0, lab, Quality.OK, 2.0), Reading(hung, 1.0, lab, Quality.OK, 2.0)))
    d.evaluate(_snap(3.0, Reading(up, 1.0, lab, Quality.OK, 3.0), Reading(hung, 0.0, lab, Quality.OK, 3.0)))
    assert d.gpu_faults.klass((N, "0")) == "service"
    d.evaluate(_snap(4.0, Reading(up, 0.0, lab, Quality.OK, 4.0), Reading(hung, 0.0, lab, Quality.OK, 4.0)))
    d.evaluate(_snap(5.0, Reading(up, 1.0, lab, Quality.OK, 5.0), Reading(hung, 0.0, lab, Quality.OK, 5.0)))
    assert d.gpu_faults.klass((N, "0")) is None  # off the bus (lost, not hung) and back: a person's visit
