"""A GPU's NVLink fabric registration (issue 34): the twin answers it as nvidia-ml-py returns it, the collector
exports it, the detector fires on a GPU off the fabric, and the resume health read waits for it.

The twin is the peer (its HTTP routes served in-process, faults injected through the simulator's own fault
kinds); the collector runs in-process against it. The detector runs on hand-made snapshots with its own
clock (the snapshot's times), so its holds are deterministic.
"""

from __future__ import annotations

import ctypes
import subprocess
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.remediation.detectors import Context, Detectors
from agent.remediation.gpu_health import check_gpus
from agent.remediation.settings import DetectorSettings
from agent.snapshot import Snapshot
from exporters.gpu import nvml_fabric
from exporters.gpu import nvml_metrics as M
from exporters.model import Quality, Reading
from exporters.render import render_readings
from sim.faults import FaultError
from sim.nvml_twin import NvmlTwin
from sim.server import Simulator
from tests.helpers import require_binary
from tests.nvml_sim import serve
from tests.test_nvml_twin_recovery import poll

NODE = "node01"
GPUS, LINKS = 2, 4


@pytest.fixture
def rig(tmp_path: Path):
    """(simulator, twin) of one node of GB200 GPUs."""
    yield from _rig(tmp_path / "gb200", "gb200")


@pytest.fixture
def h100(tmp_path: Path):
    yield from _rig(tmp_path / "h100", "h100")


def _rig(tmp_path: Path, personality: str):
    tmp_path.mkdir()
    sim = Simulator(nodes=1, gpus=GPUS, nvlinks=LINKS, devices=False, advertise=False, workdir=tmp_path,
                    personality=personality)
    sim.model.step(1.0)
    for srv in serve(sim.model):
        twin = NvmlTwin(srv.url, NODE, cache_ttl=0.0)
        twin.nvmlInit()
        yield sim, twin
        twin.nvmlShutdown()


def fabric_v3(twin: NvmlTwin, index: int) -> Any:
    """What a caller of nvidia-ml-py does: its own v3 struct (version preset), passed by reference."""
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    assert twin.nvmlDeviceGetGpuFabricInfoV(twin.nvmlDeviceGetHandleByIndex(index), ctypes.byref(info)) \
        == pynvml.NVML_SUCCESS
    return info


def field(mask: int, shift: int) -> int:
    return (mask >> shift) & 0x3


def collect(twin: NvmlTwin) -> list[Reading]:
    return poll(twin, GPUS, LINKS).readings


def series(readings: list[Reading], spec: Any) -> dict[tuple, float]:
    return {tuple(sorted((k, v) for k, v in r.labels.items() if k != "uuid")): r.value
            for r in readings if r.spec is spec and r.ok}


# -- the twin, as nvidia-ml-py returns it ------------------------------------------------------------------------


def test_the_fabric_constants_are_pynvmls():
    assert (nvml_fabric.STATE_NOT_SUPPORTED, nvml_fabric.STATE_COMPLETED) == (
        pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)
    assert (nvml_fabric.HEALTH_TRUE, nvml_fabric.HEALTH_FALSE) == (
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE, pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE)


def test_a_gb200_gpu_is_registered_and_a_fault_takes_it_off_the_fabric_until_cleared(rig):
    sim, twin = rig
    info = fabric_v3(twin, 1)
    assert (info.state, info.status, info.cliqueId) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS, 1)
    assert bytes(info.clusterUuid) != bytes(16)  # one cluster for the rack's NVLink domain
    assert field(info.healthMask, pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW) \
        == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
    assert info.healthSummary == pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY

    sim.inject("fabric-state", {"node": NODE, "gpu": "1", "state": "in_progress",
                                "health": "degraded_bandwidth,route_unhealthy"})
    info = fabric_v3(twin, 1)
    assert info.state == pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    assert field(info.healthMask, pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW) \
        == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
    assert field(info.healthMask, pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY) \
        == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE
    assert field(info.healthMask, pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY) \
        == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_FALSE
    assert fabric_v3(twin, 0).state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED  # the other GPU is untouched

    # the v2 struct, and the legacy call, answer the same registration
    v2 = pynvml.c_nvmlGpuFabricInfo_v2_t()
    twin.nvmlDeviceGetGpuFabricInfoV(twin.nvmlDeviceGetHandleByIndex(1), ctypes.byref(v2))
    legacy = pynvml.c_nvmlGpuFabricInfo_t()
    twin.nvmlDeviceGetGpuFabricInfo(twin.nvmlDeviceGetHandleByIndex(1), ctypes.byref(legacy))
    assert v2.state == legacy.state == pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    # a struct whose version is not v2/v3 (or unset) is refused as the driver refuses it
    bad = pynvml.c_nvmlGpuFabricInfo_v3_t()
    bad.version = 0
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        twin.nvmlDeviceGetGpuFabricInfoV(twin.nvmlDeviceGetHandleByIndex(1), ctypes.byref(bad))

    with pytest.raises(FaultError, match=r"fabric-state: state: expected one of \['not_started', 'in_progress', "
                                         r"'completed'\], got 'gone'"):
        sim.inject("fabric-state", {"node": NODE, "gpu": "1", "state": "gone"})
    with pytest.raises(FaultError, match=r"health: unknown condition\(s\) \['slow'\]"):
        sim.inject("fabric-state", {"node": NODE, "gpu": "1", "state": "completed", "health": "slow"})
    sim.clear()
    info = fabric_v3(twin, 1)
    assert (info.state, info.healthSummary) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
                                                pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY)


def test_every_gb200_link_reaches_a_switch_and_h100_has_no_fabric(rig, h100):
    _, twin = rig
    h = twin.nvmlDeviceGetHandleByIndex(0)
    assert [twin.nvmlDeviceGetNvLinkRemoteDeviceType(h, k) for k in range(LINKS)] \
        == [pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH] * LINKS
    with pytest.raises(pynvml.NVMLError_NotSupported):  # the switch chips sit in other trays: no PCI address
        twin.nvmlDeviceGetNvLinkRemotePciInfo(h, 0)
    sim_h, twin_h = h100
    hh = twin_h.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        twin_h.nvmlDeviceGetGpuFabricInfoV(hh, ctypes.byref(pynvml.c_nvmlGpuFabricInfo_v3_t()))
    with pytest.raises(FaultError, match="has no NVLink fabric"):
        sim_h.inject("fabric-state", {"node": NODE, "gpu": "0", "state": "in_progress"})


# -- the collector --------------------------------------------------------------------------------------------


def test_the_collector_exports_the_registration_health_clique_and_remote_types(rig):
    sim, twin = rig
    sim.inject("fabric-state", {"node": NODE, "gpu": "1", "state": "in_progress", "health": "degraded_bandwidth"})
    got = collect(twin)
    states = series(got, M.FABRIC_STATE)
    assert {k: v for k, v in states.items() if v} == {(("gpu", "0"), ("state", "completed")): 1.0,
                                                      (("gpu", "1"), ("state", "in_progress")): 1.0}
    assert len(states) == GPUS * 4  # a state set: one series per state
    assert series(got, M.FABRIC_STATUS) == {(("gpu", "0"),): 0.0, (("gpu", "1"),): 0.0}
    health = series(got, M.FABRIC_HEALTH)
    assert {k for k, v in health.items() if v} == {(("condition", "degraded_bandwidth"), ("gpu", "1"))}
    assert len(health) == GPUS * 4
    (clique,) = {dict(k)["clique_id"] for k in series(got, M.FABRIC_CLIQUE)}
    assert clique == "1" and len(series(got, M.FABRIC_CLIQUE)) == GPUS
    remote = series(got, M.NVLINK_REMOTE)
    assert len(remote) == GPUS * LINKS
    assert {(dict(k)["remote_type"], dict(k)["remote_pci_bus_id"]) for k in remote} == {("switch", "")}


def test_the_gb200_fabric_series_pass_promtools_lint(rig):
    sim, twin = rig
    sim.inject("fabric-state", {"node": NODE, "gpu": "1", "state": "in_progress", "health": "route_recovery"})
    text = render_readings(collect(twin))
    assert b"supernode_gpu_fabric_clique_info{" in text and b"supernode_nvlink_remote_info{" in text
    out = subprocess.run([require_binary("promtool"), "check", "metrics"], input=text, capture_output=True)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out.stdout + out.stderr


def test_a_gpu_reading_state_not_supported_has_no_fabric_series_and_h100_one_unsupported_reading(rig, h100):
    sim, twin = rig
    with sim.model.lock:  # what an H100 PCIe or a standalone GH200 answers: SUCCESS, state NOT_SUPPORTED
        sim.model.gpu(NODE, 0).nvml_pinned["fabric"] = {"state": 0, "status": 0, "health": [], "cluster_uuid": "",
                                                         "clique_id": 0}
        sim.model.gpu(NODE, 1).nvlink_remote_pci = [f"00000000:{0x80 + k:02X}:00.0" for k in range(LINKS)]
    got = collect(twin)
    assert {k for k, v in series(got, M.FABRIC_STATE).items() if v} == {
        (("gpu", "0"), ("state", "not_supported")), (("gpu", "1"), ("state", "completed"))}
    assert set(series(got, M.FABRIC_STATUS)) == {(("gpu", "1"),)}
    assert {dict(k)["gpu"] for k in series(got, M.FABRIC_HEALTH)} == {"1"}
    assert {dict(k)["gpu"] for k in series(got, M.FABRIC_CLIQUE)} == {"1"}
    buses = {dict(k)["link"]: dict(k)["remote_pci_bus_id"] for k in series(got, M.NVLINK_REMOTE) if dict(k)["gpu"] == "1"}
    assert buses == {str(k): f"00000000:{0x80 + k:02X}:00.0" for k in range(LINKS)}

    _, twin_h = h100
    got = collect(twin_h)
    fabric = [r for r in got if r.spec in (M.FABRIC_STATE, M.FABRIC_STATUS, M.FABRIC_HEALTH, M.FABRIC_CLIQUE)]
    assert [(r.spec, r.quality, r.labels["gpu"]) for r in fabric] == [
        (M.FABRIC_STATE, Quality.UNSUPPORTED, "0"), (M.FABRIC_STATE, Quality.UNSUPPORTED, "1")]
    assert {dict(k)["remote_type"] for k in series(got, M.NVLINK_REMOTE)} == {"switch"}  # HGX: NVSwitch


def test_a_state_nvml_h_does_not_define_is_a_partial_error_and_gives_no_state(rig):
    sim, twin = rig
    with sim.model.lock:  # a newer driver's state: neither on nor off the fabric as far as this agent knows
        sim.model.gpu(NODE, 1).nvml_pinned["fabric"] = {"state": 7, "status": 0, "health": [], "cluster_uuid": "",
                                                         "clique_id": 0}
    res = poll(twin, GPUS, LINKS)
    assert {dict(k)["gpu"] for k in series(res.readings, M.FABRIC_STATE)} == {"0"}
    assert res.partial_errors == {"nvmlDeviceGetGpuFabricInfoV": 1}


# -- the resume health read ----------------------------------------------------------------------------------


def test_the_health_read_waits_for_the_fabric_where_the_gpu_has_one(rig, h100):
    sim, twin = rig
    assert check_gpus(twin, GPUS)[0]
    sim.inject("fabric-state", {"node": NODE, "gpu": "1", "state": "in_progress"})
    assert check_gpus(twin, GPUS) == (False, "GPU 1: not registered with the NVLink fabric (state in_progress)")
    sim.inject("fabric-state", {"node": NODE, "gpu": "1", "state": "completed", "status": "999"})
    assert check_gpus(twin, GPUS) == (False, "GPU 1: NVLink fabric registration failed (status 999)")
    sim.inject("fabric-state", {"node": NODE, "gpu": "1", "state": "completed", "health": "degraded_bandwidth"})
    assert check_gpus(twin, GPUS)[0]  # on the fabric at reduced bandwidth: runs jobs
    _, twin_h = h100
    ok, why = check_gpus(twin_h, GPUS)  # NotSupported: no fabric, nothing to wait for
    assert ok, why


# -- the detector ---------------------------------------------------------------------------------------------


def _fabric(t: float, gpu: str, state: str, status: float = 0.0, health: tuple[str, ...] = ()) -> list[Reading]:
    labels = {"gpu": gpu, "uuid": f"u{gpu}"}
    out = [Reading(M.FABRIC_STATE, 1.0 if s == state else 0.0, {**labels, "state": s}, Quality.OK, t)
           for s in ("not_supported", "not_started", "in_progress", "completed")]
    if state != "not_supported":
        out.append(Reading(M.FABRIC_STATUS, status, labels, Quality.OK, t))
        out += [Reading(M.FABRIC_HEALTH, 1.0 if c in health else 0.0, {**labels, "condition": c}, Quality.OK, t)
                for c in ("degraded_bandwidth", "route_recovery", "route_unhealthy", "access_timeout_recovery")]
    return out


def _events(d: Detectors, t: float, *gpus: list[Reading]) -> list[tuple[str, str, dict]]:
    readings = tuple(r for g in gpus for r in g)
    return [(e.kind, e.targets["gpu"], e.detail) for e in d.evaluate(Snapshot(t, readings, (), monotonic=t))
            if e.detector == "gpu_fabric_degraded"]


def test_the_detector_fires_after_its_hold_on_a_gpu_off_the_fabric_and_not_on_bandwidth_alone():
    d = Detectors(DetectorSettings(), Context("n1", "r01"))
    hold = DetectorSettings().gpu_fabric_degraded
    t0 = time.time()
    assert _events(d, t0, _fabric(t0, "0", "completed"), _fabric(t0, "1", "not_supported")) == []
    # GPU 0 leaves the fabric; GPU 2 reads degraded bandwidth (a switch-side symptom); GPU 1 has no fabric
    t = t0 + 1
    assert _events(d, t, _fabric(t, "0", "in_progress"), _fabric(t, "1", "not_supported"),
                   _fabric(t, "2", "completed", health=("degraded_bandwidth",))) == []
    t = t0 + 1 + hold.fire_seconds - 1  # a re-registration that ends within the hold never fires
    assert _events(d, t, _fabric(t, "0", "in_progress"), _fabric(t, "2", "completed", health=("degraded_bandwidth",))) == []
    t = t0 + 1 + hold.fire_seconds
    assert _events(d, t, _fabric(t, "0", "in_progress"), _fabric(t, "2", "completed", health=("degraded_bandwidth",))) \
        == [("fire", "0", {"state": "in_progress", "status": 0, "health": []})]
    # back on the fabric: clears after its clear hold
    t2 = t + 1
    assert _events(d, t2, _fabric(t2, "0", "completed")) == []
    t3 = t2 + hold.clear_seconds
    assert [e[:2] for e in _events(d, t3, _fabric(t3, "0", "completed"))] == [("clear", "0")]


def test_the_detector_fires_on_a_failed_status_and_on_unhealthy_routes():
    d = Detectors(DetectorSettings(gpu_fabric_degraded={"fire_seconds": 0.0, "clear_seconds": 0.0}),
                  Context("n1", "r01"))
    t = time.time()
    ev = _events(d, t, _fabric(t, "0", "completed", status=999.0), _fabric(t, "1", "completed", health=("route_unhealthy",)),
                 _fabric(t, "2", "completed", health=("route_recovery", "access_timeout_recovery")))
    assert sorted(ev) == [("fire", "0", {"state": "completed", "status": 999, "health": []}),
                          ("fire", "1", {"state": "completed", "status": 0, "health": ["route_unhealthy"]})]
