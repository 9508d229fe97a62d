"""A simulated CDU over SNMP v2c on 127.0.0.1, serving a `kind: cdu` SNMP profile's objects from the rack model.

Like the Modbus devices (sim/modbus_devices.py), one class serves any such
profile: the simulator's binding file for it (sim/snmp_bindings/<profile>.yaml;
shipped profiles carry no simulator fields) names, per column, a coolant
quantity of sim/quantities.py (the vocabulary the Modbus and Redfish CDUs
read), which is turned back into the raw integer the profile decodes (its
scale and offset, or its enumeration). So the SNMP CDU shows the very same
loop as the Modbus and Redfish ones. Scalar objects only (`scalar: true`
tables): the one layout the shipped CDU profile has.

Faults: `set_offline` (the fault API's `cdu-offline`); leaks, flow and
temperatures are model changes, as for every CDU.
"""

from __future__ import annotations

from pathlib import Path

from exporters.safe_yaml import load_yaml_file
from exporters.snmp.profile import MetricMap, Profile, load_profile
from sim.quantities import READERS
from sim.rack import RackModel
from sim.snmp_agent import Oid, OidTable, SnmpAgent, SnmpSimDevice, integer, text

BINDINGS_DIR = Path(__file__).resolve().parent / "snmp_bindings"
SYS_DESCR, SYS_OBJECT_ID = (1, 3, 6, 1, 2, 1, 1, 1, 0), (1, 3, 6, 1, 2, 1, 1, 2, 0)


def _oid(text_oid: str) -> Oid:
    return tuple(int(p) for p in text_oid.split("."))


class SimSnmpCdu(SnmpSimDevice):
    """An SNMP CDU of the simulated rack; `zones` maps the profile's channels to model leak zones (default: the
    model's zones in sorted order on channels 1, 2, ...)."""

    def __init__(self, name: str, model: RackModel, profile: Profile | str = "apc-inrow-rc", port: int = 0,
                 community: str = "public", zones: dict[int, str] | None = None):
        super().__init__(port)
        self.name = name
        self.model = model
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        if self.profile.kind != "cdu" or not all(t.scalar for t in self.profile.tables.values()):
            raise ValueError(f"{self.profile.profile}: the simulated SNMP CDU serves cdu profiles of scalars only")
        with model.lock:
            default = {i + 1: z for i, z in enumerate(sorted(model.coolant.leak_zones))}
        self.zones = dict(zones) if zones is not None else default
        data = load_yaml_file(BINDINGS_DIR / f"{self.profile.profile}.yaml", "binding file") or {}
        self.bindings: dict[str, str] = dict(data.get("columns") or {})
        self.constants = {_oid(o): v for o, v in (data.get("constants") or {}).items()}
        self.sys_object_id = str(data.get("sys_object_id", "1.3.6.1.4.1.8072.3.2.10"))
        self.agent = SnmpAgent(community)

    def channel_zones(self) -> dict[int, str]:
        """Channel -> zone, as the inventory's `cdus[].channels` should say."""
        return dict(self.zones)

    def update(self, model: RackModel) -> None:
        """The model moved on (called under model.lock): a fresh table of every served object, swapped in whole, is
        built from it at the next request (SnmpAgent.pending)."""
        self.agent.pending = self._table_now

    def _table_now(self) -> OidTable:
        with self.model.lock:
            return self._build_table(self.model)

    def _build_table(self, model: RackModel) -> OidTable:
        items: dict[Oid, object] = {SYS_DESCR: text(f"{self.profile.vendor} {self.profile.model} (simulated by "
                                                    f"supernode-agent)"),
                                    SYS_OBJECT_ID: _object_id(self.sys_object_id)}
        items.update((oid, text(str(v)) if isinstance(v, str) else integer(int(v)))
                     for oid, v in self.constants.items())
        for m in self.profile.metrics:
            column = self.profile.tables[m.table].columns[m.column]
            quantity = self.bindings.get(m.column)
            if quantity is None:
                continue
            zone = self.zones.get(int(m.channel)) if m.channel is not None and m.channel.isdigit() else None
            items[_oid(column.oid) + (0,)] = integer(_raw(m, _read(model, quantity, zone)))
        return OidTable(items)

    # -- faults (called by the fault-injection API; set_offline: SnmpSimDevice) ---------

    def clear_faults(self) -> None:
        self.set_offline(False)


def _read(model: RackModel, quantity: str, zone: str | None) -> float:
    head, _, arg = quantity.rpartition(".")
    if head in READERS and arg.isdigit():
        return READERS[head](model, arg, zone)
    return READERS[quantity](model, "", zone)


def _raw(m: MetricMap, base: float) -> int:
    """The raw integer the profile decodes into `base`: its enumeration read backwards, else (base - offset) / scale."""
    if m.enum is not None:
        return next(raw for raw, value in sorted(m.enum.items()) if value == round(base))
    return round((base - m.offset) / m.scale)


def _object_id(oid: str) -> object:
    from pysnmp.proto import rfc1902

    return rfc1902.ObjectIdentifier(oid)
