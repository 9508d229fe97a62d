"""A GPU's NVLink fabric registration over NVML, read one way for the collector and the resume gate.

Why one reader: "this GPU is on its NVLink fabric" must mean the same to the
metrics, the detector that drains for it and the health read that lets a
drained node resume. On a GB200 NVL72 (no host Fabric Manager) or an HGX
with NVSwitches, a GPU joins the fabric after boot or reset
(`state` NOT_STARTED -> IN_PROGRESS -> COMPLETED, `status` the result); a
link can read Active while the GPU is off the fabric and peer-to-peer over
NVLink is dead, so the registration is what counts.

The call, as nvml.h and nvidia-ml-py 13 define it:
- `nvmlDeviceGetGpuFabricInfoV(device, &info)` with `info.version` set:
  `nvmlGpuFabricInfo_v3` (adds `healthSummary`, what nvml.h's
  `nvmlGpuFabricInfoV_t` is) or `nvmlGpuFabricInfo_v2` (clusterUuid, status,
  cliqueId, state, healthMask). A driver that knows only v2 answers
  ARGUMENT_VERSION_MISMATCH to v3: v2 is then asked, and remembered.
- A driver without the V call (R535, FUNCTION_NOT_FOUND) has the legacy
  `nvmlDeviceGetGpuFabricInfo` (`c_nvmlGpuFabricInfo_t`, no health mask).
- NOT_SUPPORTED where the GPU has no fabric (nvml.h: pre-Hopper GPUs); an
  H100 PCIe or a standalone GH200 instead answers SUCCESS with state
  NVML_GPU_FABRIC_STATE_NOT_SUPPORTED (nvidia-smi prints N/A for both, see
  tests/fixtures/nvidia-smi/gh200-*): both mean "no fabric", never "unhealthy".
- nvml.h declares `nvmlGpuFabricState_t` as unsigned char; pynvml declares
  the field c_uint, so its upper bytes are struct padding: the low byte is the state.
- healthMask: 2-bit fields (0 not supported, 1 true, 2 false) at the shifts
  the profile (exporters/profiles/nvml.yaml, `fabric_health`) names.

`lib` is pynvml or the simulator's twin. Errors propagate as the lib's NVMLError subclasses.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

STATE_NOT_SUPPORTED, STATE_COMPLETED = 0, 3  # NVML_GPU_FABRIC_STATE_* (pynvml; checked by tests/test_nvml_fabric.py)
HEALTH_TRUE, HEALTH_FALSE = 1, 2  # the 2-bit values of each healthMask condition (..._TRUE, ..._FALSE)


@dataclass(frozen=True, slots=True)
class FabricInfo:
    """One GPU's fabric registration; `health_mask` None where the call has none (the legacy struct)."""

    state: int
    status: int
    cluster_uuid: str
    clique_id: int
    health_mask: int | None

    @property
    def has_fabric(self) -> bool:
        return self.state != STATE_NOT_SUPPORTED

    @property
    def registered(self) -> bool:
        """On the fabric: state COMPLETED and status NVML_SUCCESS."""
        return self.state == STATE_COMPLETED and self.status == 0

    def condition(self, shift: int) -> int:
        """The 2-bit health value at `shift` (0: not supported or no mask)."""
        return 0 if self.health_mask is None else (self.health_mask >> shift) & 0x3


def format_uuid(raw: Any) -> str:
    """clusterUuid (16 bytes) as 8-4-4-4-12 hex, as nvidia-smi prints it."""
    b = bytes(raw)[:16].ljust(16, b"\0")
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class FabricReader:
    """Reads FabricInfo, remembering which call and struct version this driver answers."""

    def __init__(self, lib: Any):
        self._lib = lib
        self._v3 = hasattr(lib, "c_nvmlGpuFabricInfo_v3_t")
        self._legacy = False

    def read(self, handle: Any) -> FabricInfo:
        lib = self._lib
        if not self._legacy:
            try:
                return self._read_v(handle)
            except lib.NVMLError_FunctionNotFound:
                self._legacy = True
        info = lib.c_nvmlGpuFabricInfo_t()
        try:
            lib.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        except lib.NVMLError_FunctionNotFound:  # a driver older than the fabric calls: it can tell of no fabric
            raise lib.NVMLError(lib.NVML_ERROR_NOT_SUPPORTED) from None
        return _info(info, None)

    def _read_v(self, handle: Any) -> FabricInfo:
        lib = self._lib
        if self._v3:
            info = lib.c_nvmlGpuFabricInfo_v3_t()  # its constructor sets version = nvmlGpuFabricInfo_v3
            try:
                lib.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
                return _info(info, int(info.healthMask))
            except lib.NVMLError_ArgumentVersionMismatch:
                self._v3 = False
        info = lib.c_nvmlGpuFabricInfo_v2_t()
        lib.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        return _info(info, int(info.healthMask))


def _info(info: Any, health_mask: int | None) -> FabricInfo:
    return FabricInfo(state=int(info.state) & 0xFF, status=int(info.status),
                      cluster_uuid=format_uuid(info.clusterUuid), clique_id=int(info.cliqueId),
                      health_mask=health_mask)


def fabric_unready(lib: Any, handle: Any, reader: FabricReader | None = None) -> str | None:
    """Why this GPU is not on its NVLink fabric, in words; None when it is, or has no fabric (NotSupported,
    state NOT_SUPPORTED, or a driver without the call): there is then nothing to wait for."""
    try:
        f = (reader or FabricReader(lib)).read(handle)
    except lib.NVMLError_NotSupported:
        return None
    if not f.has_fabric or f.registered:
        return None
    if f.state != STATE_COMPLETED:
        names = {1: "not_started", 2: "in_progress"}
        return f"not registered with the NVLink fabric (state {names.get(f.state, f.state)})"
    return f"NVLink fabric registration failed (status {f.status})"
