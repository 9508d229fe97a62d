"""`probe bacnet`: Who-Is the device at its address, read every point of a profile once, print the exposition."""

from __future__ import annotations

import asyncio

from exporters.cooling import modbus_metrics as mm
from exporters.cooling.bacnet import metrics as bm
from exporters.cooling.bacnet.client import BacnetLink
from exporters.cooling.bacnet.profile import load_profile
from exporters.cooling.bacnet.source import BacnetSource
from exporters.errors import ProbeError, ProfileError
from exporters.model import Quality, SourceError
from exporters.render import render_probe


async def probe_bacnet(profile_name: str, host: str, port: int, device_instance: int | None = None,
                       timeout: float = 2.0, device: str | None = None) -> str:
    """Raises ProbeError when the profile is unknown, the device does not answer, refuses every object, or has none
    of the profile's objects (the profile does not fit it)."""
    try:
        profile = load_profile(profile_name)
    except ProfileError as exc:
        raise ProbeError(str(exc)) from None
    name = device or f"{host}:{port}"
    link = BacnetLink(host, port, device_instance=device_instance, timeout=timeout, name=name)
    src = BacnetSource(profile.kind, name, profile, link, cov=False)
    try:
        async with asyncio.timeout(timeout * 4 + 1):
            result = await src.poll()
    except SourceError as exc:
        raise ProbeError(f"{host}:{port} ({profile.name}): {exc.kind}: {exc}") from None
    except TimeoutError:
        raise ProbeError(f"{host}:{port} ({profile.name}): no answer in time") from None
    finally:
        await src.close()
    polled = [r for r in result.readings if r.spec.name not in bm.ALL and r.spec is not mm.CDU_INFO]
    if polled and all(r.quality is Quality.UNSUPPORTED for r in polled):
        raise ProbeError(f"{host}:{port}: profile {profile.name} does not fit: the device has none of its objects")
    return render_probe(profile.kind, name, result.readings)
