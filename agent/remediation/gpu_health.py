"""The agent's own GPU health read over NVML: what a resume, a GPU reset and a node reboot are verified with.

Why one function: "healthy" must mean the same before a node goes back to its jobs whichever step brought it
there: every expected GPU visible and answering, NVML's recovery action (field 230) NONE, no HBM row
remap that failed (the GPU then needs service whatever a reset says), and, where the GPU has an NVLink fabric
(GB200 NVL72, HGX with NVSwitches), its fabric registration completed with status success: a GPU off the
fabric runs no multi-node NVLink work, so a node drained for its NVLink fabric does not resume until its
GPUs are back on it (exporters/gpu/nvml_fabric.py; NotSupported: no fabric, nothing to wait for).
"""

from __future__ import annotations

from typing import Any

from exporters.gpu.nvml_fabric import FabricReader, fabric_unready

RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (exporters/profiles/nvml.yaml)
_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _field_value(fv: Any) -> int:
    """The integer in a c_nvmlFieldValue_t, read by its valueType (the union member NVML filled)."""
    return int(getattr(fv.value, _VALUE_ATTR.get(int(fv.valueType), "ullVal")))


def _remap_failed(lib: Any, h: Any) -> bool:
    """nvmlDeviceGetRemappedRows' failureOccurred; False where the GPU has no row remapping (NotSupported)."""
    try:
        rows = lib.nvmlDeviceGetRemappedRows(h)
    except lib.NVMLError:
        return False
    return bool(rows[3])  # (corrected rows, uncorrected rows, remap pending, failure occurred)


def check_gpus(lib: Any, expected: int, indices: list[int] | None = None) -> tuple[bool, str]:
    """(healthy, why in words); blocking: call it on a thread with a timeout (a wedged driver hangs NVML)."""
    count = lib.nvmlDeviceGetCount()
    fabric = FabricReader(lib)
    if expected and count < expected:
        return False, f"{count} of {expected} GPUs visible to NVML"
    for i in (range(count) if indices is None else indices):
        try:
            h = lib.nvmlDeviceGetHandleByIndex(i)
            lib.nvmlDeviceGetUUID(h)
            fv = lib.nvmlDeviceGetFieldValues(h, [RECOVERY_ACTION_FIELD])[0]
        except Exception as exc:  # GPU_IS_LOST and friends: the GPU is not healthy
            return False, f"GPU {i} does not answer NVML: {exc}"
        if fv.nvmlReturn == lib.NVML_SUCCESS and _field_value(fv) != 0:
            return False, f"GPU {i}: NVML asks for recovery action {_field_value(fv)} (not NONE)"
        if _remap_failed(lib, h):
            return False, f"GPU {i}: an HBM row remap failed (the GPU needs service)"
        try:
            why = fabric_unready(lib, h, fabric)
        except lib.NVMLError as exc:
            return False, f"GPU {i}: NVLink fabric state unreadable: {exc}"
        if why:
            return False, f"GPU {i}: {why}"
    which = f"GPU {', '.join(map(str, indices))}" if indices is not None else f"{count} GPUs"
    return True, f"{which} answer NVML, recovery action NONE, no failed row remap, on the NVLink fabric where it has one"
