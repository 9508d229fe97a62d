"""`probe redfish`: walk one Redfish service, poll it once, print what `/metrics` would show.

Why apart from the collector: it turns the collector's error kinds into what a
person bringing up a BMC needs to read (the certificate is not trusted: give
--ca-file or --pin; the login was refused; this is not a Redfish service) and
renders with the agent's own renderer.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from exporters.model import SourceError
from exporters.redfish.client import RedfishClient
from exporters.redfish.profile import ProfileError
from exporters.redfish.source import RedfishSource
from exporters.render import render_probe
from exporters.errors import ProbeError

HINTS = {
    "tls": "the service's certificate is not trusted: give --ca-file (the CA that signed it) or --pin "
           "(its SHA-256 fingerprint); verification is never skipped",
    "auth": "the service refused the credentials: check --user and --password-file",
    "timeout": "the service did not answer in time (--timeout)",
    "connection": "nothing answers there (address, port, firewall)",
}


async def probe_redfish(url: str, user: str | None = None, password: str | None = None,
                        ca_file: Path | str | None = None, pinned_sha256: str | None = None, kind: str = "tray",
                        name: str | None = None, profile: str = "dmtf", auth: str = "session",
                        timeout: float = 5.0) -> str:
    """One walk and one poll, rendered as the agent would export them."""
    try:
        client = RedfishClient(url, user=user, password=password, ca_file=ca_file, pinned_sha256=pinned_sha256,
                               auth=auth, request_timeout=timeout)  # type: ignore[arg-type]
        src = RedfishSource(name or url, client, kind=kind, profile=profile, events="off")
    except (ValueError, ProfileError) as exc:
        raise ProbeError(str(exc)) from None
    except SourceError as exc:
        raise ProbeError(f"{exc.kind}: {exc}") from None
    try:
        async with asyncio.timeout(timeout * 20):
            result = await src.poll()
    except SourceError as exc:
        hint = HINTS.get(exc.kind)
        raise ProbeError(f"{exc.kind}: {exc}" + (f"\n  {hint}" if hint else "")) from None
    except asyncio.TimeoutError:
        raise ProbeError(f"timeout: {url}: the walk did not finish in {timeout * 20:g}s") from None
    finally:
        await src.close()
    text = render_probe("redfish", src.device, result.readings)
    if src.tree is not None and not src.tree.resources:
        text += "# no leak detectors, coolant connectors, pumps, filters or reservoirs found under this service\n"
    if result.partial_errors:
        text += "# partial errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(result.partial_errors.items())) + "\n"
    return text
