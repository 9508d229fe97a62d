"""Real `nvidia-smi -q` captures round-trip through the twin and the exporter, unit for unit.

tests/fixtures/nvidia-smi holds real captures (8x H100 on two drivers, an H200, a
GH200; see its README). sim/nvml_capture.py builds twin GPUs answering as the
captured GPUs did; here the exporter's series are compared with the capture's own
text, converted to base units by this test (W, Hz, bytes, ratios), not by the twin.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.nvml_twin import NvmlTwin
from sim.nvml_capture import CaptureError, model_from_capture, parse, spelled
from exporters.gpu import nvml_metrics as M
from exporters.model import Quality
from exporters.gpu.nvml import NvmlSource
from tests.nvml_sim import serve
from tests.test_nvml import one, poll_close, run

CAPTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
FILES = sorted(p.name for p in CAPTURES.glob("*.nvidia-smi-q.txt"))
NODE = "node01"
LINKS = 2
# exporter reason label -> nvidia-smi's line under "Clocks Event Reasons"
REASONS = {"gpu_idle": "Idle", "applications_clocks": "Applications Clocks Setting", "sw_power_cap": "SW Power Cap",
           "hw_slowdown": "HW Slowdown", "sync_boost": "Sync Boost", "sw_thermal": "SW Thermal Slowdown",
           "hw_thermal": "HW Thermal Slowdown", "hw_power_brake": "HW Power Brake Slowdown"}


def _value(section: dict, path: str) -> str:
    """The capture's text at `path`, under the name its driver prints it (R580 renamed a few lines)."""
    for part in spelled(section, path).split("/"):
        section = section[part]
    return section  # type: ignore[return-value]


def _num(section: dict, path: str, unit: str) -> float:
    text = _value(section, path)
    assert text.endswith(" " + unit), (path, text)
    return float(text[: -len(unit) - 1])


def _poll(text: str):
    model = model_from_capture(text, NODE, nvlinks=LINKS)
    gpus = len(model.nodes[NODE].gpus)
    for sim in serve(model):
        src = NvmlSource(NvmlTwin(sim.url, NODE), gpus, LINKS, call_timeout=5.0, xid_events=False, gpu_timeout=4.0)
        return run(lambda: poll_close(src, n=2))


def test_all_five_captures_are_here_with_their_licences():
    assert FILES == ["gh200-550.127.05.nvidia-smi-q.txt", "h100x8-535.161.08.nvidia-smi-q.txt",
                     "h100x8-535.183.01.nvidia-smi-q.txt", "h200-550.90.12.nvidia-smi-q.txt",
                     "h200-580.159.04.nvidia-smi-q.txt"]
    assert (CAPTURES / "LICENSE.gpud").is_file() and (CAPTURES / "LICENSE.gls").is_file()


@pytest.mark.parametrize("name", FILES)
def test_capture_round_trips_through_the_exporter(name):
    text = (CAPTURES / name).read_text()
    cap = parse(text)
    assert len(cap.gpus) == (8 if name.startswith("h100x8") else 1)
    first, second = _poll(text)
    for res in (first, second):
        assert not res.partial_errors
        for i, raw in enumerate(cap.gpus):
            gpu = str(i)
            info = [r.labels for r in res.readings if r.spec is M.GPU_INFO and r.labels["gpu"] == gpu]
            assert info == [{"gpu": gpu, "uuid": _value(raw, "GPU UUID"), "name": _value(raw, "Product Name"),
                             "serial": _value(raw, "Serial Number"), "pci_bus_id": _value(raw, "PCI/Bus Id"),
                             "vbios": _value(raw, "VBIOS Version"), "driver": cap.driver,
                             "cuda": text.split("CUDA Version")[1].split(":")[1].split()[0]}]
            assert one(res, M.POWER, gpu=gpu) == _num(raw, "GPU Power Readings/Power Draw", "W")
            for label, line in (("current", "Current Power Limit"), ("default", "Default Power Limit"),
                                ("min", "Min Power Limit"), ("max", "Max Power Limit")):
                assert one(res, M.POWER_LIMIT, gpu=gpu, limit=label) == _num(raw, f"GPU Power Readings/{line}", "W")
            assert one(res, M.TEMPERATURE, gpu=gpu, sensor="gpu") == _num(raw, "Temperature/GPU Current Temp", "C")
            assert one(res, M.TEMPERATURE, gpu=gpu, sensor="memory") == _num(raw, "Temperature/Memory Current Temp", "C")
            assert one(res, M.CLOCK, gpu=gpu, clock="sm") == _num(raw, "Clocks/SM", "MHz") * 1e6
            assert one(res, M.CLOCK, gpu=gpu, clock="memory") == _num(raw, "Clocks/Memory", "MHz") * 1e6
            assert one(res, M.UTILIZATION, gpu=gpu, engine="gpu") == _num(raw, "Utilization/Gpu", "%") / 100
            assert one(res, M.UTILIZATION, gpu=gpu, engine="memory") == _num(raw, "Utilization/Memory", "%") / 100
            assert one(res, M.MEMORY_TOTAL, gpu=gpu) == _num(raw, "FB Memory Usage/Total", "MiB") * 2**20
            assert one(res, M.MEMORY_USED, gpu=gpu) == _num(raw, "FB Memory Usage/Used", "MiB") * 2**20
            for label, line in REASONS.items():
                want = {"Active": 1.0, "Not Active": 0.0}[_value(raw, f"Clocks Event Reasons/{line}")]
                assert one(res, M.CLOCK_EVENT, gpu=gpu, reason=label) == want, (name, gpu, label)
            for scope in ("Volatile", "Aggregate"):
                ecc = _value(raw, f"ECC Errors/{scope}")
                corrected = int(ecc["SRAM Correctable"]) + int(ecc["DRAM Correctable"])
                uncorrected = sum(int(ecc[k]) for k in ("SRAM Uncorrectable Parity", "SRAM Uncorrectable SEC-DED",
                                                        "DRAM Uncorrectable"))
                assert one(res, M.ECC, gpu=gpu, type="corrected", scope=scope.lower()) == corrected
                assert one(res, M.ECC, gpu=gpu, type="uncorrected", scope=scope.lower()) == uncorrected
            rows = _value(raw, "Remapped Rows")
            assert one(res, M.REMAPPED, gpu=gpu, kind="correctable") == int(rows["Correctable Error"])
            assert one(res, M.REMAPPED, gpu=gpu, kind="uncorrectable") == int(rows["Uncorrectable Error"])
            assert one(res, M.REMAP_PENDING, gpu=gpu) == {"No": 0.0, "Yes": 1.0}[rows["Pending"]]
            assert one(res, M.REMAP_FAILURE, gpu=gpu) == {"No": 0.0, "Yes": 1.0}[rows["Remapping Failure Occurred"]]
            assert one(res, M.PCIE_REPLAYS, gpu=gpu) == int(_value(raw, "PCI/Replays Since Reset"))
            assert one(res, M.PERSISTENCE, gpu=gpu) == {"Enabled": 1.0, "Disabled": 0.0}[_value(raw, "Persistence Mode")]
            # the Fabric section: Completed/Success (HGX H100, H200) or N/A (standalone GH200, and the lent H200 of
            # R580 passed to a VM alone, without its NVLinks: no fabric, no gate)
            state = {"Completed": "completed", "N/A": "not_supported"}[_value(raw, "Fabric/State")]
            assert one(res, M.FABRIC_STATE, gpu=gpu, state=state) == 1.0, (name, gpu)
            assert not [r for r in res.readings if r.spec is M.FABRIC_HEALTH and r.labels["gpu"] == gpu]  # N/A
            c2c = [r for r in res.readings if r.spec is M.C2C_ERRORS and r.labels["gpu"] == gpu and r.ok]
            assert len(c2c) == (3 if raw.get("GPU C2C Mode") == "Enabled" else 0), (name, gpu)
    assert not [r for r in second.readings if r.quality is Quality.UNSUPPORTED]


def test_captures_hold_what_the_round_trip_is_meant_to_catch():
    """The fixtures are worth testing against: power-brake and idle reasons, an aggregate-only uncorrectable, replays."""
    h100 = parse((CAPTURES / "h100x8-535.161.08.nvidia-smi-q.txt").read_text())
    assert any(_value(g, "Clocks Event Reasons/HW Power Brake Slowdown") == "Active" for g in h100.gpus)
    gh200 = parse((CAPTURES / "gh200-550.127.05.nvidia-smi-q.txt").read_text()).gpus[0]
    assert _value(gh200, "ECC Errors/Volatile/DRAM Uncorrectable") == "0"
    assert _value(gh200, "ECC Errors/Aggregate/DRAM Uncorrectable") == "1"
    assert int(_value(h100.gpus[0], "PCI/Replays Since Reset")) > 0


def test_a_capture_without_a_value_names_it():
    text = (CAPTURES / "h200-550.90.12.nvidia-smi-q.txt").read_text()
    broken = "\n".join(line for line in text.splitlines() if "Memory Current Temp" not in line)
    with pytest.raises(CaptureError, match=r"00000000:03:00\.0.*Temperature/Memory Current Temp"):
        model_from_capture(broken)


def test_persistence_mode_follows_the_capture():
    """Every real capture has persistence on (as the twin's default): one turned off must read 0."""
    text = (CAPTURES / "h200-550.90.12.nvidia-smi-q.txt").read_text()
    off = text.replace("Persistence Mode                      : Enabled", "Persistence Mode                      : Disabled")
    assert off != text
    first, _ = _poll(off)
    assert one(first, M.PERSISTENCE, gpu="0") == 0.0


def test_r580_captures_are_read_under_their_own_names():
    """R580 prints "Average Power Draw" (what nvmlDeviceGetPowerUsage answers) beside "Instantaneous Power Draw",
    and "GPU" where R550 printed "Gpu": the twin answers the average, not the instantaneous reading."""
    text = (CAPTURES / "h200-580.159.04.nvidia-smi-q.txt").read_text()
    raw = parse(text).gpus[0]
    average = float(raw["GPU Power Readings"]["Average Power Draw"].split()[0])
    instant = float(raw["GPU Power Readings"]["Instantaneous Power Draw"].split()[0])
    assert average != instant and "Power Draw" not in raw["GPU Power Readings"]
    first, _ = _poll(text)
    assert one(first, M.POWER, gpu="0") == average
    assert one(first, M.UTILIZATION, gpu="0", engine="gpu") == int(raw["Utilization"]["GPU"].split()[0]) / 100
    assert one(first, M.FABRIC_STATE, gpu="0", state="not_supported") == 1.0  # passed alone to a VM: no fabric
