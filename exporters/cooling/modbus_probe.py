"""`probe modbus`: read one device once through a profile and print what `/metrics` would show.

Why apart from the collector: it judges whether a profile fits a device (every
point a sentinel, every request refused) and renders with the agent's own renderer.
"""

from __future__ import annotations

import asyncio
from typing import Mapping

from exporters.cooling import modbus_metrics as mm
from exporters.model import SourceError
from exporters.cooling.modbus import ModbusSource
from exporters.cooling.modbus_profile import load_profile
from exporters.errors import ProbeError, ProfileError
from exporters.render import render_probe


async def probe_modbus(profile_name: str, host: str, port: int, unit: int | None = None, timeout: float = 2.0,
                       device: str | None = None, channels: Mapping[int, str] | None = None) -> str:
    """Read one device once through a profile and return what the agent would export.

    Raises ProbeError when the profile is unknown or invalid, the device does
    not answer, refuses every request, or answers only with sentinels or
    out-of-range values (the profile does not fit it).
    """
    try:
        profile = load_profile(profile_name)
    except ProfileError as exc:
        raise ProbeError(str(exc)) from None
    name = device or f"{host}:{port}"
    src = ModbusSource(profile.kind, name, profile, host, port, unit, timeout, channels,
                       busy_retries=1, backoff_s=0.05)
    try:
        async with asyncio.timeout(timeout * (2 + len(src.blocks))):
            result = await src.poll()
    except SourceError as exc:
        if exc.kind == "protocol":
            raise ProbeError(f"{host}:{port} unit {src.unit}: profile {profile.name} does not fit: {exc}") from None
        raise ProbeError(f"{host}:{port} unit {src.unit} ({profile.name}): {exc.kind}: {exc}") from None
    except asyncio.TimeoutError:
        raise ProbeError(f"{host}:{port} unit {src.unit} ({profile.name}): no answer in time") from None
    finally:
        await src.close()
    polled = [r for r in result.readings if r.spec not in (mm.REQUESTS, mm.EXCEPTIONS, mm.CDU_INFO)]
    if result.partial_errors:
        errs = ", ".join(f"{k} x{v}" for k, v in sorted(result.partial_errors.items()))
        raise ProbeError(f"{host}:{port} unit {src.unit}: profile {profile.name} does not fit: refused requests ({errs})")
    if polled and not any(r.ok for r in polled):
        raise ProbeError(f"{host}:{port} unit {src.unit}: profile {profile.name} does not fit: "
                         f"every point is a sentinel or out of range")
    return render_probe(profile.kind, name, result.readings)
