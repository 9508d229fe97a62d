"""The twin's GPU health causes (issue 33) as nvidia-ml-py answers them, and the NVML source's reading of them.

A clock slowdown sets NVML's clock-event bits (HW Power Brake with the HW Slowdown umbrella bit, as nvidia-smi
shows) and holds the SM clock down; a slow GPU with no reason sets none. The PCIe link's current and maximum
width and generation reach `supernode_gpu_pcie_link_*`, and a GPU whose NVML answers NotSupported gives one
unsupported reading per call, never a value.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pynvml
import pytest

from exporters.gpu import nvml_metrics as M
from exporters.gpu.nvml import NvmlSource
from exporters.model import Quality
from sim.faults import FaultError
from tests.test_nvml_twin_recovery import GPUS, LINKS, NODE, collect, rig  # noqa: F401 (rig: the fixture)


def test_a_clock_slowdown_sets_its_nvml_reasons_and_holds_the_sm_clock_down(rig):  # noqa: F811
    sim, twin = rig
    h = twin.nvmlDeviceGetHandleByIndex(1)
    full = twin.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
    brake = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown | pynvml.nvmlClocksEventReasonHwSlowdown
    assert twin.nvmlDeviceGetCurrentClocksEventReasons(h) & brake == 0
    sim.inject("clock-slowdown", {"node": NODE, "gpu": "1", "reason": "hw_power_brake", "ratio": "0.5"})
    assert twin.nvmlDeviceGetCurrentClocksEventReasons(h) & brake == brake
    assert twin.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == int(full * 0.5)
    sim.inject("clock-slowdown", {"node": NODE, "gpu": "1", "reason": "none", "ratio": "0.7"})
    assert twin.nvmlDeviceGetCurrentClocksEventReasons(h) & brake == 0
    assert twin.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == int(full * 0.7)
    with pytest.raises(FaultError, match=r"reason: expected one of \['hw_slowdown', 'hw_power_brake', 'none'\]"):
        sim.inject("clock-slowdown", {"node": NODE, "gpu": "1", "reason": "hw_thermal"})
    with pytest.raises(FaultError, match=r"ratio: expected a share of the clock in \(0, 1\], got 0.0"):
        sim.inject("clock-slowdown", {"node": NODE, "gpu": "1", "ratio": "0"})
    sim.inject("reboot", {"node": NODE})  # the board keeps asserting it
    assert twin.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == int(full * 0.7)
    sim.clear()
    assert twin.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == full


def test_the_pcie_link_reaches_its_metrics_and_not_supported_gives_no_value(rig):  # noqa: F811
    sim, twin = rig
    sim.inject("pcie-downtrain", {"node": NODE, "gpu": "0", "width": "4", "gen": "3"})
    got = collect(twin)
    link = {(name, dict(labels)["gpu"], dict(labels)["kind"]): v for (name, labels), v in got.items()
            if name.startswith("supernode_gpu_pcie_link_")}
    assert link == {(M.PCIE_WIDTH.name, "0", "current"): 4, (M.PCIE_WIDTH.name, "0", "max"): 16,
                    (M.PCIE_GENERATION.name, "0", "current"): 3, (M.PCIE_GENERATION.name, "0", "max"): 5,
                    (M.PCIE_WIDTH.name, "1", "current"): 16, (M.PCIE_WIDTH.name, "1", "max"): 16,
                    (M.PCIE_GENERATION.name, "1", "current"): 5, (M.PCIE_GENERATION.name, "1", "max"): 5}

    sim.inject("nvml-unsupported", {"node": NODE, "gpu": "1",
                                    "names": "nvmlDeviceGetCurrPcieLinkWidth,nvmlDeviceGetMaxPcieLinkGeneration"})

    async def twice() -> list[Any]:
        src = NvmlSource(twin, GPUS, LINKS, call_timeout=5.0, xid_events=False, gpu_timeout=4.0)
        try:
            return [await src.poll(), await src.poll()]
        finally:
            await src.close()

    first, second = asyncio.run(twice())
    gpu1 = [r for r in first.readings if r.spec in (M.PCIE_WIDTH, M.PCIE_GENERATION) and r.labels["gpu"] == "1"]
    assert sorted((r.spec.name, r.labels.get("kind"), r.quality) for r in gpu1 if not r.ok) == [
        (M.PCIE_GENERATION.name, None, Quality.UNSUPPORTED), (M.PCIE_WIDTH.name, None, Quality.UNSUPPORTED)]
    assert sorted((r.spec.name, r.labels["kind"]) for r in gpu1 if r.ok) == [
        (M.PCIE_GENERATION.name, "current"), (M.PCIE_WIDTH.name, "max")]
    # Asked once: the next poll neither asks again nor says unsupported again.
    again = [r for r in second.readings if r.spec in (M.PCIE_WIDTH, M.PCIE_GENERATION) and r.labels["gpu"] == "1"]
    assert sorted((r.spec.name, r.labels["kind"]) for r in again) == [
        (M.PCIE_GENERATION.name, "current"), (M.PCIE_WIDTH.name, "max")]
