"""GPU personalities of the simulated rack: what an H100 node and a GB200 node answer over NVML.

Why: the agent targets GB200 NVL72 racks, where NVML (v565 and later) answers the
legacy NVLink error API (`nvmlDeviceGetNvLinkErrorCounter`, fields 161-163)
NotSupported and reports NVLink5 `NVML_FI_DEV_NVLINK_COUNT_*` fields instead
(BER packed as in nvml.h). An exporter tested only against an H100-shaped twin
would pass and then export nothing but NotSupported on the real rack.

A personality is a set of GpuState overrides; `apply` sets them on a GPU. Its `architecture` is the XID
catalogue's column (exporters/profiles/nvml/xid-catalogue.yaml) whose XIDs the GPU can raise.
"""

from __future__ import annotations

from typing import Any

# NVML_NVLINK_VERSION_4_0 = 6, NVML_NVLINK_VERSION_5_0 = 7 (pynvml)
_LEGACY_NVLINK = frozenset({"nvmlDeviceGetNvLinkErrorCounter", "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
                            "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY", "NVML_FI_DEV_NVLINK_ERROR_DL_CRC"})

PERSONALITIES: dict[str, dict[str, Any]] = {
    # 8x H100 80GB HBM3 SXM (h100x8-535.161.08 capture): NVLink4, 18 links, legacy error counters.
    "h100": {"name": "NVIDIA H100 80GB HBM3", "nvlink_version": 6,
             "power_limit_mw": 700_000, "default_limit_mw": 700_000, "min_limit_mw": 200_000,
             "max_limit_mw": 700_000, "memory_total": 80 * 1024**3, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
             "unsupported": frozenset(), "c2c_errors": None, "architecture": "H100",
             "pcie_max_gen": 5, "pcie_gen": 5, "pcie_max_width": 16, "pcie_width": 16,
             # no NVLink fabric registration: nvmlDeviceGetGpuFabricInfoV answers NotSupported (what nvml.h gives a
             # GPU without fabric; the capture's HGX H100 with Fabric Manager read Completed/Success instead)
             "fabric_state": None, "nvlink_remote_type": 2},  # NVML_NVLINK_DEVICE_TYPE_SWITCH (HGX NVSwitch)
    # GB200 (Blackwell, NVL72 tray): NVLink5, 18 links, legacy NVLink error API NotSupported.
    "gb200": {"name": "NVIDIA GB200", "nvlink_version": 7,
              "power_limit_mw": 1_200_000, "default_limit_mw": 1_200_000, "min_limit_mw": 200_000,
              "max_limit_mw": 1_200_000, "memory_total": 189_471 * 1024**2, "sm_clock_mhz": 1965,
              "mem_clock_mhz": 3996, "slowdown_c": 88, "shutdown_c": 93, "gpu_max_c": 87,
              "unsupported": _LEGACY_NVLINK, "c2c_errors": [0, 0, 0], "architecture": "GB200",
              "pcie_max_gen": 6, "pcie_gen": 6, "pcie_max_width": 16, "pcie_width": 16,  # Blackwell: PCIe Gen6 x16
              # registered with the NVL72 fabric (NVML_GPU_FABRIC_STATE_COMPLETED, status success); link k reaches
              # NVSwitch chip k (NVML_NVLINK_DEVICE_TYPE_SWITCH); remote PCI info NotSupported (chips in other trays)
              "fabric_state": 3, "nvlink_remote_type": 2},
}
DEFAULT = "h100"


def apply(gpu: Any, personality: str) -> None:
    """Give `gpu` (a rack.GpuState) the named personality; unknown names are refused with the list."""
    try:
        p = PERSONALITIES[personality]
    except KeyError:
        raise ValueError(f"gpu personality: expected one of {', '.join(PERSONALITIES)}, got {personality!r}") from None
    for key, value in p.items():
        setattr(gpu, key, set(value) if key == "unsupported" else list(value) if isinstance(value, list) else value)
    gpu.base_unsupported = frozenset(p["unsupported"])  # what a clear or a reboot comes back to
    gpu.power_w = min(gpu.power_w, gpu.power_limit_mw / 1000)
