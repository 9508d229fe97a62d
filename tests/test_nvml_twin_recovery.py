"""The twin behaves like the hardware a recovery ladder acts on (issue 33): XIDs by NVIDIA's catalogue entry,
a GPU reset and a node reboot and what each clears, row remaps, PCIe downtraining, a GPU missing.

Every fault is injected through the simulator's own fault kinds (`Simulator.inject`, what `supernode-sim
inject` posts) and read back through the twin over HTTP exactly as pynvml returns it, and through the GPU
collector run in-process where it already reads the field. No agent process: the twin is the peer under test.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pynvml
import pytest

from exporters.gpu import nvml_metrics as M
from exporters.gpu.nvml import NvmlSource
from sim.faults import FaultError
from sim.nvml_twin import NvmlTwin
from sim.server import Simulator
from tests.nvml_sim import serve

NODE = "node01"
GPUS, LINKS = 2, 4
RECOVERY = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION


def _sim(tmp_path: Path, personality: str = "h100") -> Simulator:
    sim = Simulator(nodes=1, gpus=GPUS, nvlinks=LINKS, devices=False, advertise=False, workdir=tmp_path,
                    personality=personality)
    sim.model.step(1.0)
    return sim


@pytest.fixture
def rig(tmp_path: Path):
    """(simulator, twin): the simulator's fault kinds on one side, its NVML routes served to a twin on the other."""
    sim = _sim(tmp_path)
    for srv in serve(sim.model):
        twin = NvmlTwin(srv.url, NODE, cache_ttl=0.0)  # every call sees the model as it is now
        twin.nvmlInit()
        yield sim, twin
        twin.nvmlShutdown()


def raised(fn, *args) -> type:
    with pytest.raises(pynvml.NVMLError) as e:
        fn(*args)
    return type(e.value)


def recovery_action(twin: NvmlTwin, index: int) -> int:
    (fv,) = twin.nvmlDeviceGetFieldValues(twin.nvmlDeviceGetHandleByIndex(index), [RECOVERY])
    assert fv.nvmlReturn == pynvml.NVML_SUCCESS
    return fv.value.uiVal


def poll(twin: NvmlTwin, gpus: int = GPUS, links: int = LINKS) -> Any:
    """One poll of the GPU collector in-process against the twin: its PollResult."""
    async def once() -> Any:
        src = NvmlSource(twin, gpus, links, call_timeout=5.0, xid_events=False, gpu_timeout=4.0)
        try:
            return await src.poll()
        finally:
            await src.close()

    return asyncio.run(once())


def collect(twin: NvmlTwin) -> dict[tuple[str, tuple], float]:
    """One poll of the GPU collector in-process against the twin: (family, sorted labels) -> value."""
    res = poll(twin)
    return {(r.spec.name, tuple(sorted((k, v) for k, v in r.labels.items() if k != "uuid"))): r.value
            for r in res.readings if r.ok}


def state_of(sim: Simulator, node: str = NODE) -> dict[str, Any]:
    return sim.state()["nodes"][node]


def test_an_xid_is_raised_by_its_catalogue_entry_for_the_gpu_architecture(rig, tmp_path):
    sim, twin = rig
    es = twin.nvmlEventSetCreate()
    twin.nvmlDeviceRegisterEvents(twin.nvmlDeviceGetHandleByIndex(1), pynvml.nvmlEventTypeXidCriticalError, es)
    result = sim.inject("xid", {"node": NODE, "gpu": "1", "code": "13"})
    assert "ROBUST_CHANNEL_GR_EXCEPTION" in result and "RESTART_APP" in result
    event = twin.nvmlEventSetWait_v2(es, 5000)
    assert (event.eventType, event.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 13)
    last = state_of(sim)["gpus"][1]["last_xid"]
    assert last["code"] == 13 and last["immediate_action"] == "RESTART_APP" and last["investigatory_action"]
    # an application error holds nothing in the hardware: no recovery asked, no fault left for a reset
    assert recovery_action(twin, 1) == pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    assert state_of(sim)["gpus"][1]["xid_faults"] == []
    # XID 145 (an NVLink5 error) is Blackwell's: an H100 cannot raise it, and the refusal says why
    with pytest.raises(FaultError, match=r"XID 145 is not in the XID catalogue for H100"):
        sim.inject("xid", {"node": NODE, "gpu": "0", "code": "145"})
    with pytest.raises(FaultError, match=r"XID 9999 is not in the XID catalogue for H100"):
        sim.inject("xid", {"node": NODE, "code": "9999"})
    twin.nvmlEventSetFree(es)
    gb200 = _sim(tmp_path / "gb200", personality="gb200")
    assert "NVLINK_RLW_ERROR" in gb200.inject("xid", {"node": NODE, "code": "145"})


def test_a_reset_needs_the_gpu_idle_and_clears_reset_class_faults_and_pending_remaps(rig):
    sim, twin = rig
    h = twin.nvmlDeviceGetHandleByIndex(0)
    assert "held until gpu_reset" in sim.inject("xid", {"node": NODE, "gpu": "0", "code": "95", "sticky": "true"})
    sim.inject("row-remap", {"node": NODE, "gpu": "0", "state": "pending"})
    # the driver's verdict, as pynvml returns it and as the collector exports it
    assert recovery_action(twin, 0) == pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    assert twin.nvmlDeviceGetRemappedRows(h) == (0, 1, 1, 0)
    before = collect(twin)
    assert before[(M.REMAP_PENDING.name, (("gpu", "0"),))] == 1.0
    assert before[(M.RECOVERY.name, (("action", "gpu_reset"), ("gpu", "0")))] == 1.0
    assert [e[1] for e in sim.model.gpu(NODE, 0).xids] == [95, 154]  # the driver reports the changed action

    # a job runs on it: the reset is refused with NVML's InUse, and nothing is cleared
    procs = twin.nvmlDeviceGetComputeRunningProcesses(h)
    assert len(procs) == 1 and procs[0].pid > 0 and procs[0].usedGpuMemory > 0
    assert raised(twin.gpu_reset, h) is pynvml.NVMLError_InUse
    with pytest.raises(FaultError, match="in use by a process"):
        sim.inject("gpu-reset", {"node": NODE, "gpu": "0"})
    assert recovery_action(twin, 0) == pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    assert twin.nvmlDeviceGetRemappedRows(h) == (0, 1, 1, 0)

    sim.inject("workload", {"node": NODE, "gpu": "0", "ratio": "0"})  # the job ends
    assert twin.nvmlDeviceGetComputeRunningProcesses(h) == []
    twin.gpu_reset(h)
    assert recovery_action(twin, 0) == pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    assert twin.nvmlDeviceGetRemappedRows(h) == (0, 1, 0, 0)  # the remap took effect; its count stays
    after = collect(twin)
    assert after[(M.REMAP_PENDING.name, (("gpu", "0"),))] == 0.0
    assert after[(M.RECOVERY.name, (("action", "none"), ("gpu", "0")))] == 1.0
    assert state_of(sim)["gpus"][0]["xid_faults"] == []


def test_a_reset_leaves_reboot_class_faults_and_a_reboot_clears_the_node(rig):
    sim, twin = rig
    boot = state_of(sim)["boot_id"]
    sim.inject("workload", {"node": NODE, "ratio": "0"})
    h0 = twin.nvmlDeviceGetHandleByIndex(0)
    h1 = twin.nvmlDeviceGetHandleByIndex(1)
    # GPU 0: a reset-class XID, and the driver asking for a reboot besides; GPU 1 falls off the bus (XID 79)
    sim.inject("xid", {"node": NODE, "gpu": "0", "code": "95", "sticky": "true"})
    sim.inject("recovery-action", {"node": NODE, "gpu": "0", "action": "2"})
    assert "held until node_reboot" in sim.inject("xid", {"node": NODE, "gpu": "1", "code": "79", "sticky": "true"})
    sim.inject("row-remap", {"node": NODE, "gpu": "0", "state": "failed"})
    assert raised(twin.nvmlDeviceGetPowerUsage, h1) is pynvml.NVMLError_GpuIsLost

    twin.gpu_reset(h0)
    assert [f["code"] for f in state_of(sim)["gpus"][0]["xid_faults"]] == []
    assert recovery_action(twin, 0) == pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT  # the reboot verdict stays
    assert raised(twin.gpu_reset, h1) is pynvml.NVMLError_GpuIsLost  # a reset cannot reach a GPU off the bus
    with pytest.raises(FaultError, match="off the bus"):
        sim.inject("gpu-reset", {"node": NODE, "gpu": "1"})
    assert [f["code"] for f in state_of(sim)["gpus"][1]["xid_faults"]] == [79]
    assert state_of(sim)["boot_id"] == boot

    sim.inject("reboot", {"node": NODE})
    after = state_of(sim)
    assert after["boot_id"] != boot and after["boots"] == 2
    assert twin.nvmlDeviceGetPowerUsage(h1) >= 0  # back on the bus
    assert recovery_action(twin, 0) == recovery_action(twin, 1) == pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    assert [g["xid_faults"] for g in after["gpus"]] == [[], []]
    # a row remap that found no spare row is hardware damage: no reboot repairs it
    assert twin.nvmlDeviceGetRemappedRows(h0) == (0, 0, 0, 1)
    assert collect(twin)[(M.REMAP_FAILURE.name, (("gpu", "0"),))] == 1.0
    with pytest.raises(FaultError, match="parameter 'node' is required"):
        sim.inject("reboot", {})


def test_a_reboot_brings_back_a_missing_gpu(rig):
    sim, twin = rig
    sim.inject("gpu-missing", {"node": NODE, "gpu": "1"})
    assert twin.nvmlDeviceGetCount() == GPUS - 1
    assert collect(twin)[(M.GPU_UP.name, (("gpu", "1"),))] == 0.0  # fewer than the inventory: that GPU is down
    sim.inject("reboot", {"node": NODE})
    assert twin.nvmlDeviceGetCount() == GPUS


def test_a_downtrained_pcie_link_reads_below_its_maximum_and_survives_reset_and_reboot(rig):
    sim, twin = rig
    h = twin.nvmlDeviceGetHandleByIndex(1)
    assert (twin.nvmlDeviceGetCurrPcieLinkWidth(h), twin.nvmlDeviceGetCurrPcieLinkGeneration(h)) == (16, 5)
    sim.inject("pcie-downtrain", {"node": NODE, "gpu": "1", "width": "8", "gen": "3"})
    assert (twin.nvmlDeviceGetCurrPcieLinkWidth(h), twin.nvmlDeviceGetCurrPcieLinkGeneration(h)) == (8, 3)
    assert (twin.nvmlDeviceGetMaxPcieLinkWidth(h), twin.nvmlDeviceGetMaxPcieLinkGeneration(h)) == (16, 5)
    assert twin.nvmlDeviceGetGpuMaxPcieLinkGeneration(h) == 5
    # idle, the link drops to Gen1 to save power (the width stays): a generation is judged under load
    sim.inject("workload", {"node": NODE, "gpu": "1", "ratio": "0"})
    assert (twin.nvmlDeviceGetCurrPcieLinkWidth(h), twin.nvmlDeviceGetCurrPcieLinkGeneration(h)) == (8, 1)
    twin.gpu_reset(h)
    sim.inject("reboot", {"node": NODE})
    assert twin.nvmlDeviceGetCurrPcieLinkWidth(h) == 8
    with pytest.raises(FaultError, match=r"width: expected one of \[1, 2, 4, 8, 16\], got 32"):
        sim.inject("pcie-downtrain", {"node": NODE, "gpu": "1", "width": "32"})
    with pytest.raises(FaultError, match=r"gen: expected 1\.\.5, got 6"):
        sim.inject("pcie-downtrain", {"node": NODE, "gpu": "1", "gen": "6"})
    sim.clear()
    assert twin.nvmlDeviceGetCurrPcieLinkWidth(h) == 16


def test_a_recurring_fault_comes_back_after_each_reset_and_only_a_reboot_clears_it(rig):
    sim, twin = rig
    sim.inject("workload", {"node": NODE, "gpu": "0", "ratio": "0"})
    h = twin.nvmlDeviceGetHandleByIndex(0)
    sim.inject("xid", {"node": NODE, "gpu": "0", "code": "48", "sticky": "true", "recurs": "true"})
    assert recovery_action(twin, 0) == pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    seen = len(sim.model.gpu(NODE, 0).xids)
    twin.gpu_reset(h)
    # the reset ran, the defect did not go: the XID again, and the driver still asks for a reset
    assert [e[1] for e in sim.model.gpu(NODE, 0).xids[seen:]] == [48]
    assert recovery_action(twin, 0) == pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    assert [f["code"] for f in state_of(sim)["gpus"][0]["xid_faults"]] == [48]
    sim.inject("reboot", {"node": NODE})
    assert recovery_action(twin, 0) == pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    assert state_of(sim)["gpus"][0]["xid_faults"] == []
