"""A hung GPU is one GPU, with the real daemon process against the simulated rack (issue 10 item 4).

GPU 2's NVML calls hang: GPUs 0, 1 and 3 keep fresh series, GPU 2 reads
hung, and an XID 79 raised during the hang still opens an incident (the
event stream publishes on its own path). The whole driver hangs: /metrics
answers, the nvml source reads down, and it recovers once the hang clears.
"""

from __future__ import annotations

import json
import time

import pytest

from sim.demo import agent_config
from agent.remediation.detectors import Context, Detectors
from agent.remediation.settings import DetectorSettings
from agent.snapshot import Snapshot
from exporters.gpu import nvml_metrics as M
from exporters.model import Quality, Reading
from tests.agentproc import incidents, running_agent, series_value as _value
from tests.helpers import free_port, wait_for
from sim.harness import sim_rack

TOKEN = "token-for-tests"


def _open_incidents(agent) -> list[dict]:
    return incidents(agent, TOKEN)["open"]


@pytest.fixture
def rack_agent(tmp_path):
    with sim_rack(tmp_path) as rack:
        for name in ("admin.token", "webhook.token"):
            (tmp_path / name).write_text(TOKEN + "\n")
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="observe")
        # Budgets with a wide margin over a healthy read (~1 ms) on a loaded test machine: only the hang trips them.
        cfg["sources"]["nvml"].update(timeout=3.0, gpu_timeout=2.0)
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="every source polled once")
            wait_for(lambda: _value(agent.metrics(), "supernode_source_up", source="nvml", device="gpus") == 1.0
                     and _value(agent.metrics(), "supernode_source_up", source="nvml_events", device="gpus") == 1.0,
                     30, what="nvml and its event stream up")
            yield rack, agent


def test_one_hung_gpu_leaves_the_others_fresh_and_its_xid_still_opens_an_incident(rack_agent):
    rack, agent = rack_agent
    gpus = rack.sim.model.nodes["node01"].gpus
    rack.inject("gpu-hang", node="node01", gpu=2, seconds=120)
    wait_for(lambda: _value(agent.metrics(), "supernode_gpu_hung", gpu="2") == 1.0, 30, what="GPU 2 reads hung")
    hung_at = time.time()

    def fresh_others() -> dict | None:
        state = agent.state()
        power = {r["labels"]["gpu"]: r["timestamp"] for r in state["readings"]
                 if r["metric"] == "supernode_gpu_power_watts"}
        return state if all(power.get(g, 0) > hung_at for g in ("0", "1", "3")) else None

    state = wait_for(fresh_others, 30, what="GPUs 0, 1, 3 polled again after GPU 2 hung")
    text = agent.metrics()
    assert _value(text, "supernode_source_up", source="nvml", device="gpus") == 1.0
    for g in (0, 1, 3):
        assert _value(text, "supernode_gpu_up", gpu=str(g)) == 1.0
        assert _value(text, "supernode_gpu_hung", gpu=str(g)) == 0.0
        assert _value(text, "supernode_gpu_power_watts", gpu=str(g), uuid=gpus[g].uuid) is not None
    assert _value(text, "supernode_gpu_up", gpu="2") == 0.0
    assert _value(text, "supernode_gpu_power_watts", gpu="2") is None  # nothing stale presented as fresh
    assert not [r for r in state["readings"] if r["labels"].get("gpu") == "2"
                and r["metric"] not in ("supernode_gpu_up", "supernode_gpu_hung", "supernode_gpu_xid_errors_total",
                                        "supernode_gpu_last_xid")]
    # remediation sees the hang: a gpu_lost incident for GPU 2 that says why
    lost = wait_for(lambda: [i for i in _open_incidents(agent) if i["detector"] == "gpu_lost"],
                    DetectorSettings().gpu_lost_hung_fire_seconds + 20, what="gpu_lost incident for the hung GPU")
    assert lost[0]["targets"] == {"node": "node01", "gpu": "2"} and lost[0]["detail"].get("why") == "hung"

    rack.inject("xid", node="node01", gpu=2, code=79)
    # off the bus: the catalogue's RESTART_BM, so the node's reboot-class incident, naming the GPU and the XID
    xid = wait_for(lambda: [i for i in _open_incidents(agent) if i["detector"] == "gpu_reboot_required"], 20,
                   what="XID 79 during the hang opens an incident")
    assert xid[0]["targets"] == {"node": "node01"}
    assert [(g["gpu"], g["xid"], g["immediate_action"]) for g in xid[0]["detail"]["gpus"]] == [("2", 79, "RESTART_BM")]
    assert _value(agent.metrics(), "supernode_gpu_xid_errors_total", gpu="2", xid="79", action="RESTART_BM") == 1.0
    assert _value(agent.metrics(), "supernode_gpu_hung", gpu="2") == 1.0  # still hung: the XID came on its own path

    rack.clear()
    wait_for(lambda: _value(agent.metrics(), "supernode_gpu_hung", gpu="2") == 0.0
             and _value(agent.metrics(), "supernode_gpu_power_watts", gpu="2") is not None, 30,
             what="GPU 2 answers again and reports")
    assert "gpu answers again gpu=2" in agent.log()


def _gpu_lost_incidents(agent) -> list[dict]:
    """Every gpu_lost incident the agent has, open or recently closed."""
    data = incidents(agent, TOKEN)
    return [i for i in data["open"] + data["recent"] if i["detector"] == "gpu_lost"]


def _hung_since(agent, gpu: str) -> float | None:
    """The timestamp of the NVML poll that read `gpu` hung, as the agent holds it (None: not hung)."""
    return next((r["timestamp"] for r in agent.state()["readings"] if r["metric"] == "supernode_gpu_hung"
                 and r["labels"].get("gpu") == gpu and r["value"] == 1.0), None)


def test_a_gpu_slow_once_opens_no_incident_and_one_hung_past_the_hold_opens_gpu_lost(rack_agent):
    """One slow read on a loaded host is not a lost GPU: it reads hung for a poll or two and answers again, and
    gpu_lost does not fire (its playbook would drain the node). A GPU still hung after
    detectors.gpu_lost_hung_fire_seconds (shipped 10 s) fires it, and not before."""
    rack, agent = rack_agent
    hold = DetectorSettings().gpu_lost_hung_fire_seconds
    rack.inject("gpu-hang", node="node01", gpu=1, seconds=120)
    wait_for(lambda: _hung_since(agent, "1"), 30, what="GPU 1 reads hung")
    rack.clear()  # its blocked call returns: the next poll's probe answers
    wait_for(lambda: _value(agent.metrics(), "supernode_gpu_up", gpu="1") == 1.0, 30, what="GPU 1 answers again")
    assert _gpu_lost_incidents(agent) == []

    rack.inject("gpu-hang", node="node01", gpu=1, seconds=120)
    hung_at = wait_for(lambda: _hung_since(agent, "1"), 30, what="GPU 1 reads hung again")
    lost = wait_for(lambda: _gpu_lost_incidents(agent), hold + 30, what="gpu_lost once the hang outlasts its hold")
    # one incident, opened by the hang that lasted (the first hang's would be older and still open)
    assert [(i["targets"], i["detail"].get("why")) for i in lost] == [({"node": "node01", "gpu": "1"}, "hung")]
    assert lost[0]["opened_at"] - hung_at >= hold, (lost[0]["opened_at"], hung_at)
    # its evidence: the poll that first read it hung (this hang's, not the first one's) and how long by the firing
    assert lost[0]["detail"]["hung_since"] == hung_at and lost[0]["detail"]["hung_seconds"] >= hold, lost[0]["detail"]
    rack.clear()


def test_a_hung_driver_marks_nvml_down_while_metrics_and_reload_answer_and_recovers(rack_agent):
    rack, agent = rack_agent
    rack.inject("nvml-driver-hang", node="node01", seconds=120)
    wait_for(lambda: _value(agent.metrics(), "supernode_source_up", source="nvml", device="gpus") == 0.0, 30,
             what="nvml source down")
    wait_for(lambda: _value(agent.metrics(), "supernode_gpu_power_watts", gpu="0") is None, 30,
             what="GPU series dropped once stale")
    # the status page does not know the GPUs now: each is "not read", none "missing" (nothing fell off the bus)
    gpus = wait_for(lambda: (g := _status_gpus(agent)) and all(x["marks"] == ["not read"] for x in g) and g, 30,
                    what="the status page's GPUs not read")
    assert [x["index"] for x in gpus] == ["0", "1", "2", "3"]
    # the poll gives up (its timeout may be longer than the staleness rule that already hid the series)
    wait_for(lambda: (_value(agent.metrics(), "supernode_source_errors_total", source="nvml", device="gpus",
                             kind="timeout") or 0) >= 1, 30, what="the hung poll counted as a timeout")
    # other sources keep polling meanwhile; /metrics answers throughout (agent.metrics asserts 200)
    wait_for(lambda: (t := agent.metrics()) and _value(t, "supernode_source_up", source="nvml", device="gpus") == 0.0
             and _value(t, "supernode_source_up", source="pdu", device="pdu-a") == 1.0, 30,
             what="the PDU polled while nvml is down")
    assert agent.get("/healthz")[0] == 200
    # A reload rebuilds remediation's NVML handle: its nvmlInit must not run on the event loop.
    status, body = agent.request("POST", "/-/reload", token=TOKEN)
    assert (status, json.loads(body)["reloaded"]) == (200, True), body
    assert agent.get("/metrics")[0] == 200
    rack.clear()
    wait_for(lambda: _value(agent.metrics(), "supernode_source_up", source="nvml", device="gpus") == 1.0
             and all(_value(agent.metrics(), "supernode_gpu_power_watts", gpu=str(g)) is not None for g in range(4)),
             60, what="nvml recovers once the driver answers")
    # the reloaded source's XID stream is attached and publishing again
    wait_for(lambda: _value(agent.metrics(), "supernode_source_up", source="nvml_events", device="gpus") == 1.0, 30,
             what="the XID event stream up again")


def _status_gpus(agent) -> list[dict]:
    """node01's GPUs as its status page lists them."""
    status, body = agent.get("/api/v1/status", token=TOKEN)
    assert status == 200, status
    return next(n["card"]["gpus"] for n in json.loads(body)["nodes"] if n["name"] == "node01")


def _reading(spec, value: float, ts: float, **labels: str) -> Reading:
    return Reading(spec, value, labels, Quality.OK, ts)


def _gpu_lost_events(d: Detectors, at: float, hung: float | None, up: float = 0.0) -> list:
    """gpu_lost's events from one poll of a 2-GPU node at monotonic `at`: GPU 0 up, GPU 1 `up`, read hung or not
    (`hung` None: no hung series, as for a GPU off the bus)."""
    now = 1_000_000.0 + at
    rs = [_reading(M.GPU_UP, 1.0, now, gpu="0", uuid="a"), _reading(M.GPU_UP, up, now, gpu="1", uuid="b")]
    if hung is not None:
        rs.append(_reading(M.GPU_HUNG, hung, now, gpu="1", uuid="b"))
    return [(e.kind, e.targets, e.detail) for e in d.evaluate(Snapshot(now, tuple(rs), (), monotonic=at))
            if e.detector == "gpu_lost"]


LOST_GPU1 = ("fire", {"node": "node01", "gpu": "1"})


def _hung(since: float, seconds: float) -> dict:
    return {"why": "hung", "hung_since": 1_000_000.0 + since, "hung_seconds": seconds}


def test_gpu_lost_detector_says_whether_the_gpu_hung_and_holds_a_hung_one_longer():
    """A GPU off the bus fires at once; a hung one (its reads overran their budget) only once it has read hung for
    gpu_lost_hung_fire_seconds, so a read that is slow once on a loaded host does not drain the node; its incident
    says since when it read hung and for how long."""
    s = DetectorSettings()
    assert s.gpu_lost.fire_seconds == 0.0 and s.gpu_lost_hung_fire_seconds == 10.0  # shipped: two 5 s polls more
    ctx = Context(node="node01", rack="r01", expected_gpus=2)
    lost = Detectors(s, ctx)
    assert _gpu_lost_events(lost, 0.0, None) == [(*LOST_GPU1, {"why": "lost"})]

    hung = Detectors(s, ctx)
    assert _gpu_lost_events(hung, 0.0, 1.0) == []
    assert _gpu_lost_events(hung, 5.0, 1.0) == []
    assert _gpu_lost_events(hung, 9.9, 1.0) == []
    # the evidence: since when it read hung (its first hung poll's time) and for how long when it fired
    assert _gpu_lost_events(hung, 10.0, 1.0) == [(*LOST_GPU1, _hung(since=0.0, seconds=10.0))]

    # slow once, then answering: the hold starts again at the next hang, and nothing fires meanwhile
    once = Detectors(s, ctx)
    assert _gpu_lost_events(once, 0.0, 1.0) == []
    assert _gpu_lost_events(once, 5.0, 0.0, up=1.0) == []
    assert _gpu_lost_events(once, 10.0, 1.0) == []
    assert _gpu_lost_events(once, 15.0, 1.0) == []
    assert _gpu_lost_events(once, 20.0, 1.0) == [(*LOST_GPU1, _hung(since=10.0, seconds=10.0))]

    # hung, then off the bus (its blocked call came back GPU_IS_LOST): lost fires at once, not after the hung hold
    then_lost = Detectors(s, ctx)
    assert _gpu_lost_events(then_lost, 0.0, 1.0) == []
    assert _gpu_lost_events(then_lost, 5.0, 0.0) == [(*LOST_GPU1, {"why": "lost"})]


def test_a_hung_gpu_is_never_held_shorter_than_gpu_lost_itself():
    """The hung hold is a floor on gpu_lost's own fire hold, never a way round a longer one an operator set."""
    s = DetectorSettings.model_validate({"gpu_lost": {"fire_seconds": 30.0}, "gpu_lost_hung_fire_seconds": 10.0})
    d = Detectors(s, Context(node="node01", rack="r01", expected_gpus=2))
    assert _gpu_lost_events(d, 0.0, 1.0) == []
    assert _gpu_lost_events(d, 29.0, 1.0) == []
    assert _gpu_lost_events(d, 30.0, 1.0) == [(*LOST_GPU1, _hung(since=0.0, seconds=30.0))]


def test_remediation_nvml_init_runs_off_the_caller_and_times_out_on_a_hung_driver(tmp_path):
    import pynvml

    from sim.nvml_twin import NvmlTwin
    from exporters.gpu.nvml_control import InitOnFirstUse, get_power_limit

    with sim_rack(tmp_path) as rack:
        rack.inject("nvml-driver-hang", node="node01", seconds=120)
        twin = NvmlTwin(rack.url, "node01")
        lib = InitOnFirstUse(twin, timeout=0.5)  # returns at once: the init blocks on its own thread
        assert twin._inits == 0
        assert lib.NVMLError is pynvml.NVMLError and lib.NVML_TEMPERATURE_GPU == pynvml.NVML_TEMPERATURE_GPU
        with pytest.raises(pynvml.NVMLError_Timeout):
            get_power_limit(lib, 0)
        rack.clear()
        wait_for(lambda: twin._inits == 1, 10, what="the init returns once the driver answers")
        assert get_power_limit(lib, 0) == rack.sim.model.gpu("node01", 0).power_limit_mw / 1000


def test_a_gpu_budget_that_does_not_fit_the_poll_timeout_is_refused_naming_it(tmp_path):
    from agent.config import ConfigError, parse_config

    cfg = {"agent": {"rack": "r01", "node": "node01", "state_dir": str(tmp_path)},
           "sources": {"nvml": {"timeout": 1.0, "gpu_timeout": 1.0}}}
    with pytest.raises(ConfigError) as err:
        parse_config(cfg)
    assert "sources.nvml" in str(err.value) and "gpu_timeout" in str(err.value)
    cfg["sources"]["nvml"]["gpu_timeout"] = 0.25
    assert parse_config(cfg).config.sources.nvml.gpu_timeout == 0.25
