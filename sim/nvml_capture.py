"""Twin GPUs built from real `nvidia-smi -q` captures, so the exporter is checked against hardware, not our own model.

Why: a twin that only agrees with itself hides unit and scope mistakes. A capture
(tests/fixtures/nvidia-smi/) fixes what a real GPU said; `model_from_capture`
builds a rack node whose GPUs answer NVML with exactly those values (in NVML's
own units: mW, MHz, bytes, the clock-event bit mask, ECC per scope), and the
tests compare the exporter's series with the capture's text.

The captured values are pinned (`GpuState.nvml_pinned`, applied over the model's
physics in sim/nvml_api.py); what a capture lacks (energy, NVLink counters,
driver thresholds, which these drivers print as T.Limit offsets) stays the model's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pynvml

from sim.nvml_personality import apply as apply_personality
from sim.rack import RackModel

_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_KV = re.compile(r"^(\s*)(.*?)\s*(?::\s*(.*))?$")

# nvidia-smi's "Clocks Event Reasons" lines -> the NVML bit behind each (nvmlDeviceGetCurrentClocksEventReasons)
_REASONS = {
    "Idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "Applications Clocks Setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "SW Power Cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "HW Slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "HW Thermal Slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "HW Power Brake Slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "Sync Boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "SW Thermal Slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "Display Clock Setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}
# Product Architecture -> the twin personality whose NVLink generation it has
_ARCH_PERSONALITY = {"Hopper": "h100", "Blackwell": "gb200"}


class CaptureError(ValueError):
    """The capture lacks a value the twin needs; the message names it and the GPU."""


@dataclass
class Capture:
    driver: str
    cuda: int  # as nvmlSystemGetCudaDriverVersion answers: 12020 for "12.2"
    gpus: list[dict[str, Any]] = field(default_factory=list)  # per GPU: nested sections as dicts of text


def parse(text: str) -> Capture:
    """The sections of an `nvidia-smi -q` text, nested by indentation (values are the printed text)."""
    top: dict[str, Any] = {}
    gpus: list[dict[str, Any]] = []
    stack: list[tuple[int, dict[str, Any]]] = [(-1, top)]
    for line in text.splitlines():
        if not line.strip() or line.startswith("="):
            continue
        m = _GPU.match(line)
        if m:
            gpu: dict[str, Any] = {"_bus_id": m.group(1)}
            gpus.append(gpu)
            stack = [(-1, top), (0, gpu)]
            continue
        km = _KV.match(line)
        assert km is not None  # the pattern matches any line
        indent, key, value = len(km.group(1)), km.group(2), km.group(3)
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if value is None or value == "":
            parent[key] = section = {}
            stack.append((indent, section))
        else:
            parent[key] = value
    try:
        major, minor = top["CUDA Version"].split(".")
        return Capture(top["Driver Version"], int(major) * 1000 + int(minor) * 10, gpus)
    except (KeyError, ValueError) as e:
        raise CaptureError(f"capture: Driver Version / CUDA Version missing or malformed ({e})") from None


# Lines that later drivers print under another name (seen on R580 against R535/R550): a path is read under its
# first spelling the capture has. "Average Power Draw" is what nvmlDeviceGetPowerUsage answers on Ampere and later
# (its 1 s average), printed from R560 on beside "Instantaneous Power Draw".
SPELLINGS: dict[str, tuple[str, ...]] = {
    "GPU Power Readings/Power Draw": ("GPU Power Readings/Power Draw", "GPU Power Readings/Average Power Draw"),
    "Utilization/Gpu": ("Utilization/Gpu", "Utilization/GPU"),
}


def spelled(gpu: dict[str, Any], path: str) -> str:
    """The spelling of `path` this GPU's capture uses (the path itself when it has none of them)."""
    for candidate in SPELLINGS.get(path, ()):
        node: Any = gpu
        for part in candidate.split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return candidate
    return path


def get(gpu: dict[str, Any], path: str) -> str:
    """The text at `Section/Sub/Key` of one GPU (under the spelling its driver prints), or CaptureError naming it."""
    node: Any = gpu
    path = spelled(gpu, path)
    for part in path.split("/"):
        if not isinstance(node, dict) or part not in node:
            raise CaptureError(f"capture GPU {gpu.get('_bus_id')}: no {path!r}")
        node = node[part]
    if not isinstance(node, str):
        raise CaptureError(f"capture GPU {gpu.get('_bus_id')}: {path!r} is a section, not a value")
    return node


def number(gpu: dict[str, Any], path: str, unit: str) -> float:
    """A value printed with its unit ("67.74 W", "2619 MHz", "39 C", "0 %")."""
    text = get(gpu, path)
    value, _, got = text.partition(" ")
    if got != unit:
        raise CaptureError(f"capture GPU {gpu['_bus_id']}: {path!r} = {text!r}, expected a value in {unit}")
    return float(value)


def _count(gpu: dict[str, Any], path: str, keys: tuple[str, ...]) -> int:
    return sum(int(get(gpu, f"{path}/{k}")) for k in keys)


def nvml_answers(gpu: dict[str, Any]) -> dict[str, Any]:
    """What NVML answers for this captured GPU, in the twin's state keys and NVML's units."""
    reasons = 0
    for name, bit in _REASONS.items():  # "HW Slowdown" has a value, so its indented children land beside it
        if get(gpu, f"Clocks Event Reasons/{name}") == "Active":
            reasons |= bit
    ecc = {}
    for scope in ("Volatile", "Aggregate"):
        ecc[scope] = [_count(gpu, f"ECC Errors/{scope}", ("SRAM Correctable", "DRAM Correctable")),
                      _count(gpu, f"ECC Errors/{scope}", ("SRAM Uncorrectable Parity", "SRAM Uncorrectable SEC-DED",
                                                            "DRAM Uncorrectable"))]
    mib = 1024 * 1024
    return {
        "name": get(gpu, "Product Name"), "serial": get(gpu, "Serial Number"), "uuid": get(gpu, "GPU UUID"),
        "vbios": get(gpu, "VBIOS Version"), "pci_bus_id": get(gpu, "PCI/Bus Id"),
        "power_mw": round(number(gpu, "GPU Power Readings/Power Draw", "W") * 1000),
        "limit_mw": round(number(gpu, "GPU Power Readings/Current Power Limit", "W") * 1000),
        "default_limit_mw": round(number(gpu, "GPU Power Readings/Default Power Limit", "W") * 1000),
        "min_limit_mw": round(number(gpu, "GPU Power Readings/Min Power Limit", "W") * 1000),
        "max_limit_mw": round(number(gpu, "GPU Power Readings/Max Power Limit", "W") * 1000),
        "temp_c": int(number(gpu, "Temperature/GPU Current Temp", "C")),
        "mem_temp_c": int(number(gpu, "Temperature/Memory Current Temp", "C")),
        "sm_mhz": int(number(gpu, "Clocks/SM", "MHz")), "mem_mhz": int(number(gpu, "Clocks/Memory", "MHz")),
        "util_gpu": int(number(gpu, "Utilization/Gpu", "%")), "util_mem": int(number(gpu, "Utilization/Memory", "%")),
        "mem_total": int(number(gpu, "FB Memory Usage/Total", "MiB")) * mib,
        "mem_used": int(number(gpu, "FB Memory Usage/Used", "MiB")) * mib,
        "reasons": reasons,
        "ecc": ecc["Volatile"], "ecc_aggregate": ecc["Aggregate"],
        "remap": [int(get(gpu, "Remapped Rows/Correctable Error")), int(get(gpu, "Remapped Rows/Uncorrectable Error")),
                  int(get(gpu, "Remapped Rows/Pending") == "Yes"),
                  int(get(gpu, "Remapped Rows/Remapping Failure Occurred") == "Yes")],
        "pcie_replays": int(get(gpu, "PCI/Replays Since Reset")),
        "persistence": get(gpu, "Persistence Mode") == "Enabled",
        "fabric": _fabric(gpu),
    }


# nvidia-smi's Fabric State text -> NVML_GPU_FABRIC_STATE_*; N/A: no fabric (SUCCESS with state NOT_SUPPORTED, what
# an H100 PCIe is seen to answer; a driver's NotSupported prints the same)
_FABRIC_STATES = {"N/A": 0, "Not Supported": 0, "Not Started": 1, "In Progress": 2, "Completed": 3}


def _fabric(gpu: dict[str, Any]) -> dict[str, Any]:
    """The captured Fabric section as the twin's fabric answer: Completed/Success on the HGX H100s (Fabric Manager)
    and the H200, N/A on the standalone GH200. Health conditions the capture prints N/A (or, R535, not at all)
    are reported not supported (a zero health mask)."""
    state, status = get(gpu, "Fabric/State"), get(gpu, "Fabric/Status")
    if state not in _FABRIC_STATES:
        raise CaptureError(f"capture GPU {gpu['_bus_id']}: 'Fabric/State' = {state!r}, expected one of "
                           f"{', '.join(_FABRIC_STATES)}")
    if status not in ("Success", "N/A"):
        raise CaptureError(f"capture GPU {gpu['_bus_id']}: 'Fabric/Status' = {status!r}, expected Success or N/A")
    section = gpu["Fabric"]
    clique = section.get("CliqueId", "N/A")
    cluster = section.get("ClusterUUID", "N/A")
    return {"state": _FABRIC_STATES[state], "status": 0, "health": [], "health_mask": 0,
            "clique_id": int(clique) if clique.isdigit() else 0, "cluster_uuid": "" if cluster == "N/A" else cluster}


def model_from_capture(text: str, node: str = "node01", nvlinks: int = 18) -> RackModel:
    """A one-node rack whose GPUs answer NVML as the captured GPUs did (in the capture's order)."""
    cap = parse(text)
    if not cap.gpus:
        raise CaptureError("capture: no 'GPU <bus id>' section")
    model = RackModel(nodes=1, gpus_per_node=len(cap.gpus), nvlinks=nvlinks)
    with model.lock:
        n = model.nodes[node]
        n.nvml_pinned = {"driver": cap.driver, "cuda": cap.cuda}
        for g, raw in zip(n.gpus, cap.gpus):
            apply_personality(g, _ARCH_PERSONALITY.get(raw.get("Product Architecture", ""), "h100"))
            pinned = nvml_answers(raw)
            g.uuid, g.name, g.serial, g.pci_bus_id = pinned["uuid"], pinned["name"], pinned["serial"], pinned["pci_bus_id"]
            g.nvml_pinned = pinned
            g.c2c_errors = [0, 0, 0] if raw.get("GPU C2C Mode") == "Enabled" else None  # Grace-Hopper/Blackwell
    return model
