"""`supernode-agent probe KIND`: poll one device once and print the exposition the agent would serve.

For bringing up a new CDU, PDU or node: it says at once whether the device
answers and whether the profile fits, without running the daemon.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, Callable

from exporters.errors import ProbeError, ProfileError
from exporters.model import SourceError


def _probe_nvml(args: argparse.Namespace) -> str:
    """The library the agent would use (real pynvml, or with --sim the simulator's twin through its entry point),
    polled once by exporters/gpu/nvml_probe.py."""
    from exporters.gpu.nvml_probe import probe_nvml

    if args.sim is not None:
        from agent.backends import NVML_TWIN, load_backend
        from agent.config import ConfigError

        try:
            lib: Any = load_backend(NVML_TWIN, "probe nvml --sim")(args.sim or None, args.node)
        except (ConfigError, LookupError, ValueError) as exc:
            raise ProbeError(str(exc)) from None
    else:
        import pynvml

        lib = pynvml
    return asyncio.run(probe_nvml(lib, args.expect_gpus, args.nvlinks, args.timeout))


PROBES: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], str]]] = {}


def _nvml_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sim", nargs="?", const="", default=None,
                   help="use the simulator's NVML twin (URL, or found by itself)")
    p.add_argument("--node", default="node01", help="simulated node (with --sim)")
    p.add_argument("--expect-gpus", type=int, default=0, help="GPUs the inventory expects (0: do not check)")
    p.add_argument("--nvlinks", type=int, default=18)
    p.add_argument("--timeout", type=float, default=5.0)


PROBES["nvml"] = (_nvml_args, _probe_nvml)


def _links_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-dom", action="store_true", help="skip transceiver reads (slow: ~0.1 s a module)")


def _probe_links(args: argparse.Namespace) -> str:
    from agent.config import ConfigError, load_config
    from exporters.links.links_probe import probe_links

    try:
        cfg = load_config(args.config).config
    except ConfigError as exc:
        raise ProbeError(str(exc)) from None
    if not cfg.inventory.ports:
        raise ProbeError(f"{args.config}: inventory.ports is empty; nothing to probe")
    try:
        return probe_links(cfg.inventory.ports, cfg.sources.sysfs_root, cfg.sources.dom.dom_dir, dom=not args.no_dom)
    except SourceError as exc:
        raise ProbeError(f"{exc.kind}: {exc}") from None


PROBES["links"] = (_links_args, _probe_links)


def _target(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ProbeError(f"--target: expected HOST:PORT, got {text!r}")
    return host, int(port)


def _modbus_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="profile name (exporters/profiles/modbus/NAME.yaml)")
    p.add_argument("--target", required=True, help="HOST:PORT of the Modbus TCP device or gateway")
    p.add_argument("--unit", type=int, default=None, help="unit id (default: the profile's)")
    p.add_argument("--timeout", type=float, default=2.0)


def _probe_modbus(args: argparse.Namespace) -> str:
    from exporters.cooling.modbus_probe import probe_modbus

    host, port = _target(args.target)
    try:
        return asyncio.run(probe_modbus(args.profile, host, port, args.unit, timeout=args.timeout))
    except ProfileError as exc:
        raise ProbeError(str(exc)) from None
    except SourceError as exc:
        raise ProbeError(f"{exc.kind}: {exc}") from None


def _snmp_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="profile name (exporters/profiles/snmp/NAME.yaml: a PDU's or, "
                                                    "kind cdu, a CDU's), or auto: a PDU's chosen from "
                                                    "sysObjectID/sysDescr, printed with the reason")
    p.add_argument("--target", required=True, help="HOST:PORT of the PDU's or CDU's SNMP agent")
    p.add_argument("--community", default=None, help="v2c community (prefer --community-file)")
    p.add_argument("--community-file", default=None, help="file holding the v2c community")
    p.add_argument("--v3-user", default=None)
    p.add_argument("--v3-auth-key-file", default=None)
    p.add_argument("--v3-priv-key-file", default=None)
    p.add_argument("--v3-auth-proto", default="SHA")
    p.add_argument("--v3-priv-proto", default="AES")
    p.add_argument("--v3-context", default="")
    p.add_argument("--timeout", type=float, default=1.0)
    p.add_argument("--retries", type=int, default=1)
    p.add_argument("--max-walk-rows", type=int, default=None, help="rows of one column at most (default 10000)")
    p.add_argument("--max-walk-requests", type=int, default=None, help="GETBULK requests of one walk at most "
                                                                       "(default 500)")


def _read_secret(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return open(path).read().strip()
    except OSError as exc:
        raise ProbeError(f"cannot read {path}: {exc.strerror}") from None


def _probe_snmp(args: argparse.Namespace) -> str:
    """A PDU (exporters/power/pdu.py), or a CDU where the profile is of kind cdu (exporters/cooling/snmp_cdu.py)."""
    from exporters.power.pdu import probe_snmp
    from exporters.snmp.client import MAX_REQUESTS, MAX_ROWS, credentials

    host, port = _target(args.target)
    community = args.community or _read_secret(args.community_file)
    auth_key, priv_key = _read_secret(args.v3_auth_key_file), _read_secret(args.v3_priv_key_file)
    limits = dict(timeout=args.timeout, retries=args.retries, max_rows=args.max_walk_rows or MAX_ROWS,
                  max_requests=args.max_walk_requests or MAX_REQUESTS)
    try:
        profile = _snmp_cdu_profile(args.profile)
        if profile is not None:
            from exporters.cooling.snmp_cdu import probe_snmp_cdu

            creds = credentials(community, args.v3_user, auth_key, priv_key, args.v3_auth_proto, args.v3_priv_proto,
                                args.v3_context)
            return asyncio.run(probe_snmp_cdu(profile, host, port, creds, **limits))
        return asyncio.run(probe_snmp(args.profile, host, port, community=None if args.v3_user else community,
                                      v3_user=args.v3_user, auth_key=auth_key, priv_key=priv_key,
                                      auth_protocol=args.v3_auth_proto, priv_protocol=args.v3_priv_proto,
                                      context=args.v3_context, **limits))
    except ProfileError as exc:
        raise ProbeError(str(exc)) from None
    except SourceError as exc:
        raise ProbeError(f"{exc.kind}: {exc}") from None


def _snmp_cdu_profile(name: str) -> Any:
    """The named profile when it is a CDU's (kind cdu); None for auto and PDU profiles (the PDU probe loads those)."""
    if name == "auto":
        return None
    from exporters.snmp.profile import load_profile

    profile = load_profile(name)
    return profile if profile.kind == "cdu" else None


def _redfish_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="https://HOST[:PORT] of the Redfish service (BMC or CDU)")
    p.add_argument("--user", default=None, help="account for the session login")
    p.add_argument("--password-file", default=None, help="file holding the password")
    p.add_argument("--ca-file", default=None, help="CA bundle the service's certificate must chain to")
    p.add_argument("--pin", default=None, help="trust exactly the certificate with this SHA-256 fingerprint")
    p.add_argument("--auth", choices=("session", "basic"), default="session")
    p.add_argument("--kind", choices=("tray", "cdu", "switch"), default="tray", help="what the inventory would call it")
    p.add_argument("--name", default=None, help="inventory name (the bmc label; default: the URL)")
    p.add_argument("--profile", default=None, help="profile name (exporters/profiles/redfish/NAME.yaml; default: "
                                                   "dmtf, dmtf-switch for --kind switch, as the inventory's)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds one request may take")


def _probe_redfish(args: argparse.Namespace) -> str:
    from agent.config import SWITCH_PROFILE
    from exporters.redfish.probe import ProbeError as RedfishProbeError, probe_redfish

    if args.ca_file and args.pin:
        raise ProbeError("give --ca-file or --pin, not both")
    if args.password_file and not args.user:
        raise ProbeError("--password-file needs --user")
    try:
        return asyncio.run(probe_redfish(args.target, args.user, _read_secret(args.password_file), args.ca_file,
                                         args.pin, kind=args.kind, name=args.name,
                                         profile=args.profile or (SWITCH_PROFILE if args.kind == "switch" else "dmtf"),
                                         auth=args.auth, timeout=args.timeout))
    except RedfishProbeError as exc:
        raise ProbeError(str(exc)) from None


def _bacnet_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="profile name (exporters/profiles/bacnet/NAME.yaml)")
    p.add_argument("--target", required=True, help="HOST:PORT of the BACnet/IP device (UDP; the Who-Is goes there only)")
    p.add_argument("--device-instance", type=int, default=None,
                   help="the device object's instance (default: from its I-Am)")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds one request may take")


def _probe_bacnet(args: argparse.Namespace) -> str:
    from exporters.cooling.bacnet.probe import probe_bacnet

    host, port = _target(args.target)
    return asyncio.run(probe_bacnet(args.profile, host, port, args.device_instance, timeout=args.timeout))


PROBES["modbus"] = (_modbus_args, _probe_modbus)
PROBES["bacnet"] = (_bacnet_args, _probe_bacnet)
PROBES["snmp"] = (_snmp_args, _probe_snmp)
PROBES["redfish"] = (_redfish_args, _probe_redfish)


def add_probe_parsers(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="probe_kind", required=True)
    for name, (add_args, _) in PROBES.items():
        add_args(sub.add_parser(name, help=f"probe {name}"))


def run(args: argparse.Namespace) -> str:
    return PROBES[args.probe_kind][1](args)
