"""`probe nvml`: poll a node's GPUs once through NVML and print what `/metrics` would show.

Why apart from the collector, beside the other probes (exporters/cooling/modbus_probe.py,
exporters/links/links_probe.py, exporters/redfish/probe.py): bringing up a node needs one answer, at once,
from the driver the agent will use, rendered with the agent's own renderer, without running the daemon.
The library is given (real pynvml, or a pynvml-like twin the caller chose): exporters never pick one.
"""

from __future__ import annotations

from typing import Any

from exporters.errors import ProbeError
from exporters.gpu.nvml import NvmlSource
from exporters.model import SourceError
from exporters.render import render_probe


async def probe_nvml(lib: Any, expect_gpus: int = 0, nvlinks: int = 0, timeout: float = 2.0) -> str:
    """One NVML poll of every GPU through `lib`, rendered as the agent would export it; ProbeError naming the
    NVML error (pynvml raises NVMLError subclasses) or the source's failure."""
    src = NvmlSource(lib, expect_gpus, nvlinks, call_timeout=timeout, xid_events=False)
    try:
        result = await src.poll()
    except SourceError as exc:
        raise ProbeError(f"{exc.kind}: {exc}") from None
    except Exception as exc:
        raise ProbeError(f"{type(exc).__name__}: {exc}") from None
    finally:
        await src.close()
    return render_probe("nvml", "gpus", result.readings)
