"""The agent's one YAML config: identity, listener, rack inventory, sources, secrets.

Validated in full at load (pydantic), so a bad file is refused with the path
of the bad field before anything runs, and a reload that fails keeps the
running config. Secrets are never in the YAML itself, only the paths of the
files that hold them; their values are `SecretStr` and print as `**********`.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from pydantic_core import PydanticCustomError

from agent.cdu_coverage import coverage_warnings
from agent.config_refs import deprecation_warnings, exposure_warnings, reference_errors, secret_warnings
from agent.coordination.settings import Coordination
from agent.rack_file import RackFileError, with_rack_file
from agent.remediation.settings import RemediationSettings
from exporters.safe_yaml import InputError, parse_yaml, read_text_file
from exporters.validation import cut, error_lines, short_repr, terminal_safe

DEFAULT_CONFIG_PATH = Path("/etc/supernode-agent/agent.yaml")
MAX_CONFIG_BYTES = 1 << 20
MAX_SECRET_BYTES = 64 << 10
LEGACY_ADMIN = "admin"  # the `who` of the single admin token of older configs (secrets.admin_token)

_BARE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")

Mode = Literal["observe", "dry-run", "enforce"]


class ConfigError(Exception):
    """A config that cannot be used; the message names the field path and what was expected."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def short_hostname() -> str:
    """The host name up to its first dot: what Slurm and the rack file call a node by default."""
    return socket.gethostname().split(".", 1)[0]


class Identity(Strict):
    rack: str = Field(min_length=1, description="Rack name, as in the scrape config's target labels.")
    node: str = Field(default_factory=lambda: short_hostname(), min_length=1, description=(
        "This node's name, as the scheduler knows it; default: the host name, short form."))
    role: str = Field(default="compute", description="compute, switch, management...")
    mode: Mode = Field(default="observe", description="Remediation mode; a fresh install observes.")
    state_dir: Path = Field(default=Path("/var/lib/supernode-agent"), description="Journal and runtime state.")
    event_loop: Literal["asyncio", "uvloop"] = Field(default="asyncio", description=(
        "The event loop the daemon runs on: Python's own (asyncio, the default), or uvloop (libuv: fewer "
        "instructions per wake-up of the loop, where most of an idle agent's CPU goes; bench/bench_overhead.py "
        "--set agent.event_loop=uvloop measures it). uvloop is not the default: with it, right after a tray BMC "
        "went offline (its connections failing and timing out), one scrape of the agent's /metrics was closed "
        "without an answer in the test suite, as in aiohttp's open issue 10506 with uvloop (a connection attempt "
        "that fails inside uvloop's create_connection leaves it holding a descriptor the kernel hands out again)."))


class Tls(Strict):
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = Field(default=None, description="Require client certificates signed by this CA.")


def bare_name(v: str) -> str:
    """A profile or token name: letters, digits, `_.-`; never a path (`/`, `..`)."""
    if not _BARE_NAME.match(v) or ".." in v:
        raise ValueError(f"expected a bare name (letters, digits, _ . -; no path), got {short_repr(v)}")
    return v


BareName = Annotated[str, AfterValidator(bare_name)]


class Listen(Strict):
    address: str = Field(default="127.0.0.1", description="Explicit bind address; never a library default.")
    port: int = Field(default=9877, ge=0, le=65535)
    tls: Tls | None = None
    max_body_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20, description="Largest request body accepted.")
    max_connections: int = Field(default=512, ge=8, le=65536, description=(
        "Open connections at most (also kept under the process's file limit); over it, the oldest "
        "connection still sending its request is closed, so /metrics and /healthz keep being answered."))
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=300, description=(
        "A connection must send its request headers within this (from connect or its previous response)."))
    body_timeout_seconds: float = Field(default=30.0, gt=0, le=600, description="A request body must arrive within this.")
    allowed_hosts: list[str] | None = Field(default=None, description=(
        "Host header values accepted (without port), against DNS rebinding; default: any (so Prometheus scrapes "
        "work out of the box), with a warning at check-config and start when the address is not a loopback one."))

    @field_validator("address")
    @classmethod
    def _ip(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise ValueError(f"expected an IP address, got {short_repr(v)}") from None
        return v


class SecretRef(Strict):
    file: Path = Field(description="File whose content (stripped) is the secret.")


class Auth(Strict):
    """Who may call the admin API, and whether reads need a token."""

    admin_tokens: dict[BareName, SecretRef] = Field(default_factory=dict, description=(
        "Name -> token file. The name of the token a request used is recorded as who approved or reset."))
    open_reads: bool = Field(default=False, description=(
        "Serve /api/v1/incidents and /api/v1/journal without a token (they name nodes, incidents and actions)."))


class GpuInventory(Strict):
    count: int = Field(default=0, ge=0, description="GPUs expected on this node; fewer seen means GPU lost.")
    nvlinks_per_gpu: int = Field(default=18, ge=0, le=18)


class Port(Strict):
    name: str = Field(min_length=1, description="Interface name (eth) or device/port (ib: mlx5_0/1).")
    kind: Literal["ib", "eth"] = "eth"
    isolatable: bool = Field(default=False, description="Remediation may take this port down (redundant path).")
    netdev: str | None = Field(default=None, description="Netdev name for DOM reads of an IB port.")


class Coolant(Strict):
    """The secondary loop's fluid, for heat removed = flow x density x heat capacity x dT."""

    name: str = Field(default="PG25", description="Label only (PG25 = 25 % propylene glycol).")
    density_kg_m3: float = Field(default=1025.0, gt=500, lt=2000, description="Density near loop temperature.")
    heat_capacity_j_kgk: float = Field(default=3900.0, gt=1000, lt=5000, description="Specific heat, J/(kg K).")


class ModbusDevice(Strict):
    name: str = Field(min_length=1)
    profile: BareName = Field(description="Profile name under exporters/profiles/modbus/.")
    host: str = "127.0.0.1"
    port: int = Field(default=502, ge=1, le=65535)

    unit: int | None = Field(default=None, ge=0, le=255, description="Overrides the profile's unit id.")
    coolant: Coolant = Field(default_factory=Coolant, description="Coolant of the loop this CDU serves (PG25).")
    channels: dict[int, str] = Field(default_factory=dict,
                                     description="Profile leak/valve channel -> leak zone name (inventory leak_zones).")


BACNET_PORT = 47808  # BACnet/IP's registered UDP port (0xBAC0)


class LeakZone(Strict):
    name: str = Field(min_length=1)
    nodes: list[str] = Field(default_factory=list, description="Nodes whose hardware this zone's leak endangers.")
    gpus: list[int] | None = Field(default=None, description="GPUs of those nodes in the zone (default: all).")
    valve: str | None = Field(default=None, description="cdu:point of the zone isolation valve.")


class SnmpAccess(Strict):
    """How the agent speaks SNMP to one device (a PDU, an SNMP CDU): version, credentials by secret name, bounds."""

    version: Literal["2c", "3"] = "2c"
    community_secret: str | None = Field(default=None, description="Name in `secrets` holding the community.")
    v3_user: str | None = None
    v3_auth_secret: str | None = None
    v3_priv_secret: str | None = None
    v3_auth_protocol: Literal["MD5", "SHA", "SHA224", "SHA256", "SHA384", "SHA512"] = "SHA"
    v3_priv_protocol: Literal["DES", "AES", "AES192", "AES256"] = "AES"
    v3_context: str = Field(default="", description="SNMPv3 context name (empty on most devices).")
    request_timeout: float = Field(default=0.5, gt=0, le=30, description="Seconds to wait for one SNMP reply.")
    retries: int = Field(default=1, ge=0, le=5, description="Resends of an unanswered SNMP request.")
    max_repetitions: int = Field(default=10, ge=1, le=100, description="GETBULK max-repetitions.")
    max_walk_rows: int = Field(default=10_000, ge=1, le=1_000_000,
                               description="Rows of one table column per poll at most (a longer column is an error).")
    max_walk_requests: int = Field(default=500, ge=1, le=100_000,
                                   description="GETBULK requests of one poll's walk at most.")

    SECRETS: ClassVar[tuple[str, ...]] = ("community_secret", "v3_auth_secret", "v3_priv_secret")


SNMP_FIELDS = frozenset(SnmpAccess.model_fields)
SNMP_PORT = 161


class CduDevice(ModbusDevice, SnmpAccess):
    """A rack CDU: over Modbus TCP (the default), SNMP (v2c/v3, the PDUs' fields) or BACnet/IP. Whatever the
    protocol it feeds the same coolant and leak detectors (the same families), its channels map to leak zones, and
    it is a shared rack device."""

    protocol: Literal["modbus", "snmp", "bacnet"] = Field(default="modbus", description=(
        "modbus: profile under exporters/profiles/modbus/, port 502; snmp: a `kind: cdu` profile under "
        "exporters/profiles/snmp/, UDP port 161, with the SNMP fields of a PDU entry; bacnet: profile under "
        "exporters/profiles/bacnet/, UDP port 47808, Who-Is sent to host:port only (never a broadcast)."))
    device_instance: int | None = Field(default=None, ge=0, le=4194302, description=(
        "BACnet: the device object's instance; default: learnt from its I-Am to the Who-Is sent to host:port "
        "(set it for a device that ignores Who-Is)."))

    @model_validator(mode="before")
    @classmethod
    def _protocol_port(cls, data: Any) -> Any:
        default = {"snmp": SNMP_PORT, "bacnet": BACNET_PORT}.get(data.get("protocol")) if isinstance(data, dict) \
            else None
        if default is not None and "port" not in data:
            return {**data, "port": default}
        return data

    @model_validator(mode="after")
    def _protocol_fields(self) -> "CduDevice":
        if self.protocol != "modbus" and self.unit is not None:
            raise ValueError("unit: a Modbus unit id; " + ("an SNMP CDU has none" if self.protocol == "snmp"
                                                           else "a BACnet device is named by device_instance"))
        if self.protocol != "bacnet" and self.device_instance is not None:
            raise ValueError(f"device_instance: BACnet only (this CDU's protocol is {self.protocol})")
        stray = sorted(SNMP_FIELDS & self.model_fields_set) if self.protocol != "snmp" else []
        if stray:
            raise ValueError(f"{stray[0]}: SNMP only (this CDU's protocol is {self.protocol})")
        return self


class Pdu(SnmpAccess):
    name: str = Field(min_length=1)
    profile: BareName = Field(description="Profile name under exporters/profiles/snmp/, or `auto`: chosen from the "
                                          "PDU's sysObjectID/sysDescr (exporters/profiles/snmp-auto.yaml).")
    host: str = "127.0.0.1"
    port: int = Field(default=SNMP_PORT, ge=1, le=65535)
    outlets: dict[str, str] = Field(default_factory=dict, description="Outlet id -> node it feeds.")


def agent_url(v: str) -> str:
    """A peer agent's base URL: http(s)://host[:port], nothing else (no user, path, query or fragment)."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(v)
        u.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        raise ValueError(f"expected http(s)://host:port, got {short_repr(v)} ({exc})") from None
    if u.scheme not in ("http", "https") or not u.hostname or u.username or u.password or u.query or u.fragment \
            or u.path not in ("", "/"):
        raise ValueError(f"expected http(s)://host:port (no user, path, query or fragment), got {short_repr(v)}")
    return v.rstrip("/")


AgentUrl = Annotated[str, AfterValidator(agent_url)]
SWITCH_PROFILE = "dmtf-switch"  # the default profile of a kind switch service (its chassis, sensors, detectors)


class RedfishEndpoint(Strict):
    """A Redfish service the agent reads: a compute tray's BMC (kind tray), a CDU (kind cdu) or an NVLink switch
    tray's BMC (kind switch, named by an inventory.switch_trays entry)."""

    name: str = Field(min_length=1, description="Inventory name; the `bmc` label of its series.")
    kind: Literal["tray", "cdu", "switch"] = Field(description=(
        "tray: one node's tray BMC; cdu: a rack CDU's service; switch: an NVLink switch tray's BMC (a shared rack "
        "device, like a CDU; its leak is a leak of the switch tray's zone)."))
    url: str = Field(description="https://host[:port] of the service (its root is /redfish/v1); https only.")
    node: str | None = Field(default=None, description="kind tray: the node this tray BMC manages.")
    zone: str | None = Field(default=None, description=(
        "Leak zone its detectors report into. Default: for a tray, the one leak zone listing its node (a tray "
        "leak is a leak of that node's own zone); for a CDU, its own name (not an inventory zone: notify only)."))
    profile: BareName = Field(default="dmtf", description=(
        f"Profile name under exporters/profiles/redfish/ (default: dmtf; {SWITCH_PROFILE} for kind switch)."))
    user: str | None = Field(default=None, description="Account for session login (or Basic).")
    password_secret: str | None = Field(default=None, description="Name in `secrets` holding the password.")
    auth: Literal["session", "basic"] = Field(default="session", description=(
        "session: SessionService login, X-Auth-Token, a new login on 401 (Basic where the service has no "
        "SessionService); basic: HTTP Basic on every request."))
    ca_file: Path | None = Field(default=None, description=(
        "CA bundle the service's certificate must chain to (host name checked); default: the system CAs."))
    pinned_sha256: str | None = Field(default=None, description=(
        "Trust exactly this certificate: its SHA-256 fingerprint (64 hex digits, colons allowed), for a "
        "self-signed BMC. Verification is never skipped."))
    event_token_secret: str | None = Field(default=None, description=(
        "Name in `secrets` of this service's own push token (its push deliveries must carry it; another "
        "service's token is refused on its path). Default: sources.redfish.event_token_secret, shared by every "
        "service without its own (check-config warns: one BMC could then push in another's name)."))

    @field_validator("url")
    @classmethod
    def _https(cls, v: str) -> str:
        from exporters.redfish.client import origin_of

        origin_of(v)  # raises ValueError with what was expected
        return v

    @field_validator("pinned_sha256")
    @classmethod
    def _pin(cls, v: str | None) -> str | None:
        if v is not None:
            from exporters.redfish.client import parse_pin

            parse_pin(v)
        return v

    @model_validator(mode="before")
    @classmethod
    def _switch_profile(cls, data: Any) -> Any:
        """A switch tray's BMC is read for its chassis health and temperatures too: its own profile by default."""
        if isinstance(data, dict) and data.get("kind") == "switch" and "profile" not in data:
            return {**data, "profile": SWITCH_PROFILE}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "RedfishEndpoint":
        if self.kind == "tray" and not self.node:
            raise ValueError("node: required for kind tray (the node whose tray this BMC manages)")
        if self.kind != "tray" and self.node:
            raise ValueError(f"node: only for kind tray (a {self.kind} serves the rack)")
        if self.kind == "switch" and self.zone is not None:
            raise ValueError("zone: not for kind switch (its zone is its inventory.switch_trays entry's)")
        if self.ca_file is not None and self.pinned_sha256 is not None:
            raise ValueError("give ca_file or pinned_sha256, not both")
        if (self.user is None) != (self.password_secret is None):
            raise ValueError("user and password_secret go together")
        return self


RACK_UNITS_MAX = 60  # the tallest racks in use are 58U; a larger number is a typo
NVSWITCH_CHIPS = 18  # NVSwitch chips of an NVL72 domain: NVLink index k of every GPU reaches chip k


class SwitchTray(Strict):
    """An NVLink switch tray: its NVSwitch chips, the leak zone its coolant endangers, its BMC."""

    name: str = Field(min_length=1, description="Inventory name (switch01...): what incidents and pages call it.")
    chips: list[Annotated[int, Field(ge=0, lt=NVSWITCH_CHIPS)]] = Field(min_length=1, description=(
        "NVSwitch chips in this tray (0..17: the NVLink index that reaches each); a GB200 NVL72 tray j holds "
        "chips 2(j-1) and 2(j-1)+1."))
    zone: str = Field(min_length=1, description=(
        "Leak zone (inventory.leak_zones) its leak detectors report into: a switch tray leak drains and caps that "
        "zone's compute nodes."))
    bmc: str = Field(min_length=1, description="Name of its BMC in inventory.redfish (kind switch).")


class Inventory(Strict):
    nodes: list[str] = Field(default_factory=list, description="All nodes of the rack (this one included).")
    agent_urls: dict[str, AgentUrl] = Field(default_factory=dict, description=(
        "Node -> base URL of its agent (http(s)://host:port): the status page shows those nodes' GPUs and links, "
        "fetched by this agent (TLS verified, status.peer_tls)."))
    gpus: GpuInventory = GpuInventory()
    ports: list[Port] = Field(default_factory=list)
    cdus: list[CduDevice] = Field(default_factory=list, description=(
        "The rack's CDUs over Modbus TCP, SNMP or BACnet/IP (`protocol`); Redfish CDUs are inventory.redfish "
        "entries of kind cdu."))
    leak_controllers: list[ModbusDevice] = Field(default_factory=list)
    leak_zones: list[LeakZone] = Field(default_factory=list)
    pdus: list[Pdu] = Field(default_factory=list)
    redfish: list[RedfishEndpoint] = Field(default_factory=list, description=(
        "Redfish services: each node's tray BMC (each agent reads its own), the rack's Redfish CDUs and the NVLink "
        "switch trays' BMCs."))
    switch_trays: list[SwitchTray] = Field(default_factory=list, description=(
        "The NVLink switch trays of the rack (an NVL72: 9 trays of 2 NVSwitch chips): read over Redfish as shared "
        "rack devices (health, temperatures, leak detectors); named by the rack's NVLink attribution."))
    rack_valve: str | None = Field(default=None, description=(
        "cdu:point of the rack's coolant isolation valve: closed (with approval) when more than "
        "remediation.detectors.rack_tray_leaks trays leak at once."))
    power_budget_watts: float | None = Field(default=None, gt=0, description="Rack power budget.")
    rack_units: dict[str, Annotated[int, Field(ge=1, le=RACK_UNITS_MAX)]] = Field(default_factory=dict, description=(
        "Tray -> its rack unit (the lowest U it occupies, counted from the bottom as on the rack's elevation "
        "drawing): every compute tray (inventory.nodes) and NVLink switch tray (inventory.switch_trays) once "
        "any is given. A tray leak watches the trays below it (remediation.leak_scope.watch_below_trays); "
        "without positions no tray is known to be below another."))

    @model_validator(mode="after")
    def _names_unique(self) -> "Inventory":
        for what, items in (("ports", self.ports), ("cdus", self.cdus), ("leak_zones", self.leak_zones),
                            ("pdus", self.pdus), ("leak_controllers", self.leak_controllers),
                            ("redfish", self.redfish), ("switch_trays", self.switch_trays)):
            seen: set[str] = set()
            for item in items:
                if item.name in seen:
                    raise ValueError(f"{what}: name {item.name!r} appears twice")
                seen.add(item.name)
        for zone in self.leak_zones:
            unknown = [n for n in zone.nodes if self.nodes and n not in self.nodes]
            if unknown:
                raise ValueError(f"leak_zones.{zone.name}.nodes: {unknown} not in inventory.nodes")
        unknown = sorted(n for n in self.agent_urls if self.nodes and n not in self.nodes)
        if unknown:
            raise ValueError(f"agent_urls: {unknown} not in inventory.nodes")
        problems = switch_tray_problems(self) + rack_unit_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def redfish_zone(self, ep: RedfishEndpoint) -> str | None:
        """The leak zone a Redfish service's detectors report into (None: a tray whose node no zone lists once)."""
        if ep.zone is not None:
            return ep.zone
        if ep.kind == "cdu":
            return ep.name
        if ep.kind == "switch":
            return next((t.zone for t in self.switch_trays if t.bmc == ep.name), None)
        zones = [z.name for z in self.leak_zones if ep.node in z.nodes]
        return zones[0] if len(zones) == 1 else None


def rack_unit_problems(inv: "Inventory") -> list[str]:
    """Each position names a tray of the inventory, no two trays share a rack unit, and once any tray has a
    position every tray has one (a tray left out would never be watched below a leak, silently)."""
    if not inv.rack_units:
        return []
    trays = list(inv.nodes) + [t.name for t in inv.switch_trays]
    out = [f"rack_units.{name}: not a tray of the inventory (inventory.nodes or inventory.switch_trays)"
           for name in inv.rack_units if name not in trays]
    at: dict[int, str] = {}
    for name, unit in inv.rack_units.items():
        if unit in at:
            out.append(f"rack_units.{name}: rack unit {unit} is already {at[unit]}'s")
        at.setdefault(unit, name)
    missing = [t for t in trays if t not in inv.rack_units]
    if missing:
        out.append(f"rack_units: no rack unit for {', '.join(missing)} (every tray needs one once any has)")
    return out


def switch_tray_problems(inv: "Inventory") -> list[str]:
    """Each switch tray's chips are its own, its zone is a leak zone, its BMC a Redfish service of kind switch;
    and every kind switch service belongs to one tray (else its leak would report into no zone)."""
    out: list[str] = []
    owner: dict[int, str] = {}
    zones = {z.name for z in inv.leak_zones}
    services = {e.name: e for e in inv.redfish}
    bmcs: dict[str, str] = {}
    for t in inv.switch_trays:
        where = f"switch_trays.{t.name}"
        for chip in t.chips:
            if chip in owner:
                out.append(f"{where}.chips: chip {chip} is already in {'this tray' if owner[chip] == t.name else owner[chip]}")
            owner[chip] = t.name
        if t.zone not in zones:
            out.append(f"{where}.zone: zone {t.zone!r} not in inventory.leak_zones ({', '.join(sorted(zones)) or 'none'})")
        ep = services.get(t.bmc)
        if ep is None:
            out.append(f"{where}.bmc: {t.bmc!r} not in inventory.redfish")
        elif ep.kind != "switch":
            out.append(f"{where}.bmc: inventory.redfish.{t.bmc} is of kind {ep.kind}, expected kind switch")
        elif t.bmc in bmcs:
            out.append(f"{where}.bmc: {t.bmc!r} is already the BMC of {bmcs[t.bmc]}")
        bmcs.setdefault(t.bmc, t.name)
    out += [f"redfish.{e.name}: kind switch but no inventory.switch_trays entry names it as its bmc"
            for e in inv.redfish if e.kind == "switch" and e.name not in bmcs]
    return out


class SourceSettings(Strict):
    enabled: bool = True
    interval: float = Field(default=5.0, gt=0, le=3600, description="Seconds between polls.")
    timeout: float = Field(default=2.0, gt=0, le=600, description="Seconds one poll may take.")
    max_backoff: float = Field(default=60.0, gt=0, description="Longest pause after repeated failures.")

    @model_validator(mode="after")
    def _timeout_fits(self) -> "SourceSettings":
        if self.timeout > self.interval * 4:
            raise ValueError(f"timeout {self.timeout}s is more than 4 intervals ({self.interval}s)")
        return self


class SafetySourceSettings(SourceSettings):
    """Leak and coolant: what a leak response waits on, so a failing controller is retried within seconds."""

    max_backoff: float = Field(default=2.0, gt=0, description=(
        "Longest pause after repeated failures: small, a leak must not wait a minute for the next try."))


class LeakSourceSettings(SafetySourceSettings):
    """Leak inputs: polled twice a second by default. Its own class, so a section that sets only the timeout
    (`leak: {timeout: 0.3}`) keeps the 0.5 s interval instead of falling back to the generic 5 s."""

    interval: float = Field(default=0.5, gt=0, le=3600, description="Seconds between polls.")
    timeout: float = Field(default=0.4, gt=0, le=600, description="Seconds one poll may take.")


class PduSourceSettings(SourceSettings):
    """PDUs: SNMP agents are slow, so a poll may take longer than the generic default."""

    timeout: float = Field(default=3.0, gt=0, le=600, description="Seconds one poll may take.")


class RedfishSourceSettings(SafetySourceSettings):
    """Redfish services (tray BMCs, CDUs): BMCs answer in tens to hundreds of ms, and events carry the fast path."""

    interval: float = Field(default=2.0, gt=0, le=3600, description=(
        "Seconds between polls (the fallback: an event triggers a read at once)."))
    timeout: float = Field(default=1.5, gt=0, le=600, description="Seconds one poll may take.")
    request_timeout: float = Field(default=1.0, gt=0, le=60, description="Seconds one HTTP request may take.")
    max_connections: int = Field(default=2, ge=1, le=4, description=(
        "Connections per service at most, the event stream included (NVIDIA advises at most 4 clients per "
        "GB200 BMC)."))
    rediscover_seconds: float = Field(default=600.0, ge=10, le=86400, description=(
        "Walk the resource tree again this often (and after a 404 on a cached resource)."))
    events: Literal["auto", "sse", "push", "off"] = Field(default="auto", description=(
        "Event push from the EventService: auto (SSE where offered, else a push subscription to "
        "event_destination), sse, push (a push subscription even where SSE is offered), off (polling only)."))
    event_destination: str | None = Field(default=None, description=(
        "This agent's base URL as the BMC reaches it (https://host:port): a push subscription delivers to "
        "<event_destination>/api/v1/redfish/events/<name> where the service has no SSE."))
    event_token_secret: str | None = Field(default=None, description=(
        "Name in `secrets` of the bearer token push deliveries must carry (given to the BMC in HttpHeaders)."))
    event_retry_seconds: float = Field(default=0.5, gt=0, le=300, description=(
        "After the event stream drops (or a push subscription is lost): wait this long before opening it "
        "again, doubling up to 60 s; polling carries the detectors meanwhile."))
    event_min_poll_seconds: float = Field(default=1.0, ge=0, le=60, description=(
        "The window of the limit on polls forced by events (SSE or push) per service: up to 3 start at once in "
        "it (a leak's event is never held back behind a warning's), the others share one poll at its end (a "
        "burst of pushes cannot turn into a burst of BMC reads; the last event is always followed by a read)."))
    unconfirmed_interval: float | None = Field(default=None, ge=0, le=3600, description=(
        "Seconds between polls while a service's event subscription is not confirmed (at start, after it is "
        "lost, or where the service offers none): default the leak source's interval (sources.leak.interval, "
        "0.5 s), so a tray leak is read as fast as a Modbus one from the first second; 0: `interval` throughout. "
        "Not used with events off."))
    confirmed_interval: float = Field(default=10.0, ge=0, le=3600, description=(
        "Seconds between polls while a service's SSE event stream is open: the events carry the fast path (each "
        "relevant one polls at once), so the timer's polls are the fallback and the check that the service "
        "answers. The moment the stream is lost, polls are every `interval` again (and every "
        "`unconfirmed_interval` until it is back). A push subscription keeps `interval` (one a rebooted BMC forgot "
        "is silent). 0, or not above `interval`: every `interval` throughout."))
    login_retry_seconds: float = Field(default=5.0, gt=0, le=300, description=(
        "After a refused login, wait this long before the next (doubling up to 5 min): no account lock-out."))
    watch_rack_trays: bool = Field(default=False, description=(
        "The rack leader also reads every other tray BMC in the inventory, to count leaking trays "
        "(rack isolation beyond remediation.detectors.rack_tray_leaks). Under etcd coordination the elected "
        "leader does, and only while it leads."))

    @model_validator(mode="after")
    def _fits(self) -> "RedfishSourceSettings":
        if self.request_timeout > self.timeout:
            raise ValueError(f"request_timeout {self.request_timeout}s exceeds the poll timeout ({self.timeout}s)")
        if self.events in ("auto", "sse") and self.max_connections < 2:
            raise ValueError("max_connections: at least 2 with events on (the stream holds one)")
        if self.event_destination is not None:
            parts = urlsplit(self.event_destination)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
                raise ValueError(f"event_destination: expected this agent's base URL, http(s)://host:port, got "
                                 f"{short_repr(self.event_destination)}")
        if self.events == "push" and self.event_destination is None:
            raise ValueError("events push needs event_destination (where the BMC delivers)")
        return self


class LinksSettings(SourceSettings):
    counters_interval: float = Field(default=5.0, ge=0, le=3600, description=(
        "Seconds between reads of the ports' error counters (IB PortCounters, Ethernet statistics), rounded to a "
        "whole number of polls and at least one: state, speed, traffic and the kernel's down counts (flaps) are "
        "read every poll. Between reads the last read stands. 0: every poll."))


class NvmlSettings(SourceSettings):
    backend: Literal["nvml", "sim"] = Field(default="nvml", description="Real NVML or the simulator's twin.")
    sim_url: str | None = Field(default=None, description="Simulator URL when backend is sim.")
    xid_events: bool = True
    gpu_timeout: float = Field(default=0.5, gt=0, le=60, description="Seconds one GPU's reads may take in a poll; "
                               "a GPU that takes longer is reported hung and skipped until it answers again.")
    counters_interval: float = Field(default=5.0, ge=0, le=3600, description=(
        "Seconds between reads of the error counters (NVLink, C2C, ECC, remapped rows, PCIe replays), rounded to "
        "a whole number of polls and at least one: power, temperatures, clocks, throughput and link state are "
        "read every poll. Between reads the last read stands. 0: every poll."))

    @model_validator(mode="after")
    def _gpu_timeout_fits(self) -> "NvmlSettings":
        if self.gpu_timeout >= self.timeout:
            raise ValueError(f"gpu_timeout {self.gpu_timeout}s must be below the poll timeout ({self.timeout}s)")
        return self


class DomSettings(SourceSettings):
    """DOM is slow (about 0.1 s a module): its own slower schedule, so port state never waits on it."""

    interval: float = Field(default=30.0, gt=0, le=3600, description="Seconds between polls.")
    timeout: float = Field(default=10.0, gt=0, le=600, description="Seconds one poll may take.")
    dom_dir: Path | None = Field(default=None, description=(
        "Read <dom_dir>/<netdev>.txt (ethtool -m text, e.g. the simulator's) instead of running ethtool."))
    ethtool: str = Field(default="ethtool", min_length=1, description="ethtool binary for module EEPROM reads.")
    concurrency: int = Field(default=4, ge=1, le=64, description="Modules read at the same time.")
    module_timeout: float = Field(default=2.0, gt=0, le=60, description=(
        "Seconds one module read may take; a slower module is a partial error."))


class ImexSettings(SourceSettings):
    """IMEX (GB200 multi-node NVLink): off by default, a node without the IMEX package would read it down."""

    enabled: bool = Field(default=False, description=(
        "Run nvidia-imex-ctl (-q and -N -j -H) each poll: the local IMEX daemon's state and its domain's."))
    interval: float = Field(default=10.0, gt=0, le=3600, description="Seconds between polls.")
    timeout: float = Field(default=3.0, gt=0, le=600, description=(
        "Seconds each nvidia-imex-ctl run may take; a slower one is killed."))
    command: list[Annotated[str, Field(min_length=1)]] = Field(default=["nvidia-imex-ctl"], min_length=1, description=(
        "The tool as an argument list (e.g. [nvidia-imex-ctl, -c, /etc/nvidia-imex/config.cfg]); the source "
        "adds -q and -N -j -H."))


class ThermalResistanceSettings(SourceSettings):
    """The derived thermal resistance of each GPU's cold plate (agent/thermal_resistance.py): its load gate, its
    smoothing and its learned baseline. Derived from the snapshot (NVML and the CDU), never from a device."""

    interval: float = Field(default=5.0, gt=0, le=3600, description="Seconds between computations.")
    min_power_ratio: float = Field(default=0.5, gt=0, le=1, description=(
        "Gate: R is computed only while the GPU draws at least this share of its default (board) power limit: "
        "at low power the GPU's rise over the coolant is a few kelvin, within the sensors' error, and R = rise / "
        "power means nothing."))
    min_utilization_ratio: float = Field(default=0.5, ge=0, le=1, description=(
        "Gate: and only while its utilisation (engine gpu) is at least this (a job runs on it)."))
    settle_seconds: float = Field(default=30.0, ge=0, le=3600, description=(
        "Gate: the first samples after the gate opens are dropped for this long: the die's temperature follows a "
        "power step with the plate's thermal time constant, and R read before it settled is too low."))
    smoothing_seconds: float = Field(default=60.0, gt=0, le=86400, description=(
        "Time constant of the exponentially weighted mean R is smoothed with."))
    baseline_learn_seconds: float = Field(default=3600.0, gt=0, le=30 * 86400, description=(
        "Gated time a GPU's baseline at one flow learns for before it is a reference; afterwards it only follows "
        "R down (a cleaned plate), never up, so a fouling plate never becomes its own normal."))
    baseline_flow_band_ratio: float = Field(default=0.1, gt=0, le=1, description=(
        "Flows within this share of each other count as comparable: the baseline is learnt and judged per flow "
        "band of this width (R falls as flow rises)."))
    persist_seconds: float = Field(default=60.0, gt=0, le=86400, description=(
        "Write the learnt baselines to agent.state_dir at most this often (and when one is learnt, and at stop)."))


class BacnetSettings(Strict):
    """The BACnet/IP client of the agent (every BACnet CDU): per-request bounds and COV push. Each CDU's polls
    keep the cdu and leak sources' intervals and timeouts, as a Modbus CDU's do."""

    request_timeout: float = Field(default=1.0, gt=0, le=30, description=(
        "Seconds to wait for one BACnet reply (the stack's APDU timeout)."))
    retries: int = Field(default=0, ge=0, le=3, description=(
        "Resends of an unanswered request (0: the next poll is the retry; a leak poll runs twice a second)."))
    cov: bool = Field(default=True, description=(
        "Subscribe to the profile's COV points (leak and alarm objects): a change is pushed within one round "
        "trip; polling runs underneath either way, and alone where the device refuses COV."))
    cov_lifetime_seconds: int = Field(default=300, ge=10, le=86400, description=(
        "Lifetime asked for each COV subscription; renewed at half of it by the polls."))
    client_instance: int = Field(default=4194300, ge=0, le=4194302, description=(
        "The agent's own BACnet device instance (a BACnet client is a device too; unique on the BACnet network). "
        "The agent answers nothing with it: it only receives I-Am and COV notifications from its CDUs."))


class Sources(Strict):
    nvml: NvmlSettings = NvmlSettings()
    # Each source's defaults live in its settings class, so a partial section keeps the others' defaults.
    links: LinksSettings = LinksSettings()
    dom: DomSettings = DomSettings()
    cdu: SafetySourceSettings = SafetySourceSettings()
    leak: LeakSourceSettings = LeakSourceSettings()
    pdu: PduSourceSettings = PduSourceSettings()
    redfish: RedfishSourceSettings = RedfishSourceSettings()
    bacnet: BacnetSettings = BacnetSettings()
    imex: ImexSettings = ImexSettings()
    thermal_resistance: ThermalResistanceSettings = ThermalResistanceSettings()
    stale_after_intervals: float = Field(default=2.0, ge=1.0, description=(
        "Drop a source's readings after this many missed intervals."))
    sysfs_root: Path = Field(default=Path("/sys"), description="Root of the sysfs tree read for links.")


class PeerTls(Strict):
    """How this agent checks (and, under mTLS, answers) the agents of `inventory.agent_urls` over https."""

    ca_file: Path | None = Field(default=None, description="CA bundle that signs the peers' certificates "
                                 "(default: the system's); never skipped.")
    cert_file: Path | None = Field(default=None, description="Client certificate, for peers that require one.")
    key_file: Path | None = None

    @model_validator(mode="after")
    def _pair(self) -> "PeerTls":
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self


class MetricsSettings(Strict):
    """What /metrics exports beyond the series budget (agent/series_budget.py, README "Series budget")."""

    detail: list[str] = Field(default_factory=list, description=(
        "Family groups exported in full instead of where they inform: nvlink_link_errors (every link's error "
        "counters), nvlink_link_ber (every link's BER), nvlink_link_traffic (bytes per link), nvlink_link_remote "
        "(what each link reaches), optic_alarms (every transceiver flag, 0 or 1), gpu_state_sets (every member of "
        "the recovery action and fabric state sets and every clock-event flag, 0 or 1)."))

    @field_validator("detail")
    @classmethod
    def _known_groups(cls, value: list[str]) -> list[str]:
        from agent.series_budget import DETAIL_GROUPS

        unknown = [g for g in value if g not in DETAIL_GROUPS]
        if unknown:
            raise PydanticCustomError("detail_group", "unknown group {group}; groups: {groups}",
                                      {"group": short_repr(unknown[0]), "groups": ", ".join(DETAIL_GROUPS)})
        return value


class StatusPage(Strict):
    """The status page at `/`: one HTML page, its script and style, and a stream of the rack's state."""

    enabled: bool = True
    max_clients: int = Field(default=8, ge=1, le=64, description=(
        "Status pages streaming at once without an admin token (anonymous); more are answered 503 (each holds "
        "one connection of the listener). Pages with an admin token may use any free slot of these and the "
        "reserved_admin_clients more, so anonymous pages can never lock a person with the token out."))
    reserved_admin_clients: int = Field(default=2, ge=0, le=16, description=(
        "Stream slots on top of max_clients that only pages with a valid admin token may take: however many "
        "anonymous pages are open, this many people with the token still get the page."))
    peer_interval_seconds: float = Field(default=2.0, ge=0.5, le=60, description=(
        "While a page is open: how often the other nodes' agents (inventory.agent_urls) are asked."))
    peer_timeout_seconds: float = Field(default=1.5, gt=0, le=30, description="One peer's answer must come within this.")
    peer_tls: PeerTls = PeerTls()


class Logging(Strict):
    """The agent's own log: decisions (intent, result, block and why, approval, reset, webhook rejection) land here."""

    level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Least level logged; --log-level on the command line wins when given.")
    format: Literal["keyvalue", "json"] = Field(default="keyvalue", description="key=value lines or JSON lines.")


class Config(Strict):
    agent: Identity
    inventory_file: Path | None = Field(default=None, description=(
        "Rack file (rack: and inventory:) shared by every node, instead of an inventory section; "
        "relative to this config's directory; re-read at every reload."))
    logging: Logging = Logging()
    listen: Listen = Listen()
    inventory: Inventory = Inventory()
    sources: Sources = Sources()
    secrets: dict[str, SecretRef] = Field(default_factory=dict)
    auth: Auth = Auth()
    status: StatusPage = StatusPage()
    metrics: MetricsSettings = Field(default_factory=MetricsSettings, description=(
        "The series budget's detail switches (metrics.detail)."))
    remediation: RemediationSettings = Field(default_factory=RemediationSettings,
                                             description="Detectors, playbooks and guardrails.")
    coordination: Coordination | None = Field(default=None, description=(
        "How the rack's agents share devices, leader and guardrails; none: a lone agent (static)."))

    @model_validator(mode="after")
    def _one_url_per_peer(self) -> "Config":
        """`inventory.agent_urls` is where each node's agent is (the status page's cards, static coordination's
        fact streams); the deprecated `coordination.peers` and `peers_ca_file` are folded into it and into
        `status.peer_tls.ca_file`, so every reader sees one value, and a config giving two for one node is refused."""
        coord = self.coordination
        if coord is None or not (coord.peers or coord.peers_ca_file):
            return self
        urls = dict(self.inventory.agent_urls)
        for node, url in coord.peers.items():
            if node in urls and urls[node] != url:
                raise ValueError(f"coordination.peers.{node}: {short_repr(url)} differs from inventory.agent_urls."
                                 f"{node} ({short_repr(urls[node])}); coordination.peers is deprecated: keep "
                                 "inventory.agent_urls only")
            urls.setdefault(node, url)
        tls = self.status.peer_tls
        if coord.peers_ca_file is not None:
            if tls.ca_file is not None and tls.ca_file != coord.peers_ca_file:
                raise ValueError("coordination.peers_ca_file differs from status.peer_tls.ca_file; it is deprecated: "
                                 "keep status.peer_tls.ca_file only")
            tls = tls.model_copy(update={"ca_file": coord.peers_ca_file})
        # frozen models: the folded values replace the sections once, while the config is being built
        object.__setattr__(self, "inventory", self.inventory.model_copy(update={"agent_urls": urls}))
        object.__setattr__(self, "status", self.status.model_copy(update={"peer_tls": tls}))
        return self

    @model_validator(mode="after")
    def _snmp_retries_fit_the_poll(self) -> "Config":
        """One SNMP request with its retries must fit the poll's timeout (a PDU's, an SNMP CDU's), or the retries
        never happen. (An SNMP CDU's leak inputs are read on the leak schedule without resends: the next poll,
        half a second later, is the retry.)"""
        devices = [("pdus", p, "pdu") for p in self.inventory.pdus]
        devices += [("cdus", c, "cdu") for c in self.inventory.cdus if c.protocol == "snmp"]
        for kind, d, source in devices:
            limit = getattr(self.sources, source).timeout
            worst = d.request_timeout * (d.retries + 1)
            if worst > limit:
                raise ValueError(f"inventory.{kind}.{d.name}: request_timeout x (retries + 1) = {worst:g}s "
                                 f"exceeds sources.{source}.timeout ({limit:g}s)")
        return self

    def dump(self) -> dict[str, Any]:
        """A JSON-safe dump; secret values are never in it (only their file paths)."""
        return self.model_dump(mode="json")


class LoadedConfig:
    """A validated config plus its secrets and admin tokens, read from their files."""

    def __init__(self, config: Config, secrets: dict[str, SecretStr], path: Path | None,
                 admin_tokens: dict[str, SecretStr] | None = None):
        self.config = config
        self.secrets = secrets
        self.path = path
        self.admin_tokens = admin_tokens if admin_tokens is not None else _admin_tokens(config, secrets, {})
        files = {f"secrets.{name}.file": ref.file for name, ref in config.secrets.items()}
        files.update({f"auth.admin_tokens.{name}.file": ref.file for name, ref in config.auth.admin_tokens.items()})
        self.warnings: list[str] = (secret_warnings(files) + deprecation_warnings(config) + exposure_warnings(config)
                                    + coverage_warnings(config.inventory))
        """Not errors, but an operator should see them (check-config prints them, start logs them)."""

    def secret(self, name: str) -> SecretStr:
        try:
            return self.secrets[name]
        except KeyError:
            raise ConfigError(f"secrets.{name}: not defined") from None


def _read_secret(ref: SecretRef, where: str) -> SecretStr:
    """A secret file: regular, small, UTF-8, not empty (a FIFO or /dev/zero is refused, never read)."""
    try:
        value = read_text_file(ref.file, MAX_SECRET_BYTES, "secret file").strip()
    except InputError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not value:
        raise ConfigError(f"{where}: {short_repr(str(ref.file))} is empty")
    return SecretStr(value)


def _read_secrets(config: Config) -> dict[str, SecretStr]:
    secrets = {name: _read_secret(ref, f"secrets.{name}.file") for name, ref in config.secrets.items()}
    snmp = [("pdus", p) for p in config.inventory.pdus] + [("cdus", c) for c in config.inventory.cdus
                                                            if c.protocol == "snmp"]
    for kind, device in snmp:
        for attr in SnmpAccess.SECRETS:
            ref_name = getattr(device, attr)
            if ref_name is not None and ref_name not in secrets:
                raise ConfigError(f"inventory.{kind}.{device.name}.{attr}: secret {ref_name!r} not in secrets")
    for ep in config.inventory.redfish:
        if ep.password_secret is not None and ep.password_secret not in secrets:
            raise ConfigError(f"inventory.redfish.{ep.name}.password_secret: secret {ep.password_secret!r} "
                              f"not in secrets")
        if ep.event_token_secret is not None and ep.event_token_secret not in secrets:
            raise ConfigError(f"inventory.redfish.{ep.name}.event_token_secret: secret {ep.event_token_secret!r} "
                              f"not in secrets")
    etcd = config.coordination.etcd if config.coordination is not None else None
    if etcd is not None and etcd.password_secret is not None and etcd.password_secret not in secrets:
        raise ConfigError(f"coordination.etcd.password_secret: secret {etcd.password_secret!r} not in secrets")
    token = config.sources.redfish.event_token_secret
    if token is not None and token not in secrets:
        raise ConfigError(f"sources.redfish.event_token_secret: secret {token!r} not in secrets")
    return secrets


def _admin_tokens(config: Config, secrets: dict[str, SecretStr], named: dict[str, SecretStr]) -> dict[str, SecretStr]:
    """Name -> admin token: `auth.admin_tokens`, plus the single token of older configs as `admin`."""
    tokens = dict(named)
    legacy = secrets.get(config.remediation.admin_token_secret or "admin_token")
    if legacy is not None and LEGACY_ADMIN not in tokens:
        tokens[LEGACY_ADMIN] = legacy
    return tokens


def _check_profiles(config: Config) -> None:
    """Every device names a shipped profile that loads: a typo fails check-config, not `run`."""
    from exporters.cooling import modbus_profile
    from exporters.snmp import profile as snmp_profile

    devices = [(f"inventory.{kind}.{d.name}.profile", d.profile, modbus_profile)
               for kind in ("cdus", "leak_controllers") for d in getattr(config.inventory, kind)
               if getattr(d, "protocol", "modbus") == "modbus"]
    devices += [(f"inventory.cdus.{d.name}.profile", d.profile, snmp_profile) for d in config.inventory.cdus
                if d.protocol == "snmp"]
    if any(d.protocol == "bacnet" for d in config.inventory.cdus):
        from exporters.cooling.bacnet import profile as bacnet_profile

        devices += [(f"inventory.cdus.{d.name}.profile", d.profile, bacnet_profile)
                    for d in config.inventory.cdus if d.protocol == "bacnet"]
    if config.inventory.redfish:  # imported only when used: a node without Redfish never holds its models
        from exporters.redfish import profile as redfish_profile

        devices += [(f"inventory.redfish.{e.name}.profile", e.profile, redfish_profile)
                    for e in config.inventory.redfish]
    devices += [(f"inventory.pdus.{p.name}.profile", p.profile, snmp_profile) for p in config.inventory.pdus
                if p.profile != "auto"]  # auto is resolved against the device; its rules load here
    if any(p.profile == "auto" for p in config.inventory.pdus):
        from exporters.power.snmp_autodetect import load_rules
        try:
            load_rules()
        except Exception as exc:
            raise ConfigError(cut(f"inventory.pdus: profile 'auto': the detection rules do not load: {exc}", 1000)) \
                from None
    for where, name, module in devices:
        if not (module.PROFILE_DIR / f"{name}.yaml").is_file():
            known = ", ".join(sorted(f.stem for f in module.PROFILE_DIR.glob("*.yaml")))
            raise ConfigError(f"{where}: no profile {name!r} (known: {known})")
        try:
            loaded = module.load_profile(name)
        except Exception as exc:  # a shipped profile that does not load is still this field's problem
            raise ConfigError(cut(f"{where}: profile {name!r} does not load: {exc}", 1000)) from None
        kind = getattr(loaded, "kind", None) if module is snmp_profile else None
        want = "cdu" if where.startswith("inventory.cdus.") else "pdu"
        if kind is not None and kind != want:
            names = ", ".join(snmp_profile.available_profiles(kind=want))
            raise ConfigError(f"{where}: {name!r} is a {kind} profile; this entry needs a {want} one ({names})")
    for ep in config.inventory.redfish:
        if ep.ca_file is not None:
            from exporters.model import SourceError
            from exporters.redfish.client import tls_for

            try:
                tls_for(ep.ca_file, None)
            except SourceError as exc:
                raise ConfigError(f"inventory.redfish.{ep.name}.{exc}") from None


def parse_config(data: Any, source: str = "<config>", path: Path | None = None, node: str | None = None) -> LoadedConfig:
    """Validate config data; `node` stands in for agent.node (check-config --node: one node's view of a shared file)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    if node is not None and isinstance(data.get("agent", {}), dict):
        data = dict(data, agent=dict(data.get("agent") or {}, node=node))
    try:
        data, rack_path = with_rack_file(data, path, MAX_CONFIG_BYTES)
    except RackFileError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    try:
        config = Config.model_validate(data)
    except ValidationError as err:
        msg = error_lines(err, f"{source}: invalid config", show_input=True)
        if rack_path is not None:
            msg += f"\n  (inventory.* is read from the rack file {str(rack_path)!r})"
        raise ConfigError(msg) from None
    _check_playbooks(config)
    _check_profiles(config)
    _check_xid_overrides(config)
    dangling = reference_errors(config)
    if dangling:
        raise ConfigError(f"{source}: invalid config\n" + "\n".join(f"  {line}" for line in dangling))
    secrets = _read_secrets(config)
    named = {name: _read_secret(ref, f"auth.admin_tokens.{name}.file")
             for name, ref in config.auth.admin_tokens.items()}
    return LoadedConfig(config, secrets, path, _admin_tokens(config, secrets, named))


def _check_playbooks(config: Config) -> None:
    """Playbooks are part of the config: a bad one fails check-config, start and reload alike."""
    from agent.remediation.playbooks import PlaybookError, load_playbooks

    try:
        load_playbooks(config.remediation.playbook_dir)
    except PlaybookError as exc:
        raise ConfigError(cut(terminal_safe(f"remediation.playbook_dir: {exc}", keep="\n"), 2000)) from None
    except (OSError, ValueError) as exc:  # a path too long or with a NUL byte
        raise ConfigError(f"remediation.playbook_dir: cannot use {short_repr(str(config.remediation.playbook_dir))}: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None


def _check_xid_overrides(config: Config) -> None:
    """An override names a catalogue XID and the catalogue's own actions: a typo fails check-config, naming it."""
    overrides = config.remediation.xid_overrides
    if not overrides:
        return
    from exporters.errors import ProfileError
    from exporters.gpu.xid_catalogue import load_catalogue_file

    try:
        catalogue = load_catalogue_file()
    except ProfileError as exc:
        raise ConfigError(f"remediation.xid_overrides: the XID catalogue does not load: {exc}") from None
    known = {e.code for e in catalogue.xids}
    immediate = catalogue.immediate_actions()
    errors = []
    for code, override in sorted(overrides.items()):
        path = f"remediation.xid_overrides.{code}"
        if code not in known:
            errors.append(f"{path}: XID {code} is not in the catalogue (Ampere/Hopper/Blackwell XIDs only)")
        if override.immediate_action is not None and override.immediate_action not in immediate:
            errors.append(f"{path}.immediate_action: {short_repr(override.immediate_action)} is not a catalogue "
                          f"immediate action (one of {', '.join(sorted(immediate))})")
        inv = override.investigatory_action
        if inv is not None and inv not in catalogue.guidance_classes:
            errors.append(f"{path}.investigatory_action: {short_repr(inv)} is not a catalogue guidance class")
    if errors:
        raise ConfigError("invalid config\n" + "\n".join(f"  {line}" for line in errors))


def load_config(path: Path | str, node: str | None = None) -> LoadedConfig:
    """Read, parse and validate a config file in bounded time and memory; ConfigError for anything wrong."""
    path = Path(path)
    try:
        data = parse_yaml(read_text_file(path, MAX_CONFIG_BYTES, "config file"), str(path))
    except InputError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None
    return parse_config(data, str(path), path, node)
