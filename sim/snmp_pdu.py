"""Simulated Raritan PX3 rack PDU (PDU2-MIB tables) fed by the rack model, over SNMP v2c on 127.0.0.1.

Each node is fed by `outlets_per_node` outlets (redundant PSUs) that share
its power (RackModel.node_power_w = GPUs + base load); outlets are spread
over 3 inlet poles (phases) round-robin; the inlet is the sum. Values are
served as PDU2-MIB unsigned integers with per-sensor decimal digits, energy
in Wh wrapping at 2^32, so the collector's scaling and counter logic meet
what a real PX3 sends. Switching an outlet by SET (switchingOperation)
cuts its share; with every outlet of a node off the node loses power in
the model (`NodeState.powered`), so its GPUs drop to 0 W.

Fault hooks (called by the simulator's fault API): `set_offline`,
`counter_wrap`, `counter_reset`, `trip_outlet`.
"""

from __future__ import annotations

import math
import threading

from sim.rack import RackModel
from sim.snmp_agent import Oid, OidTable, SetRefused, SnmpAgent, SnmpSimDevice, gauge, integer, text

PDU2 = (1, 3, 6, 1, 4, 1, 13742, 6)
INLET_VALUE = PDU2 + (5, 2, 3, 1, 4)
INLET_STATE = PDU2 + (5, 2, 3, 1, 3)
INLET_DIGITS = PDU2 + (3, 3, 4, 1, 7)
POLE_VALUE = PDU2 + (5, 2, 4, 1, 4)
POLE_DIGITS = PDU2 + (3, 3, 6, 1, 7)
POLE_UPPER_CRIT = PDU2 + (3, 3, 6, 1, 23)
OUTLET_VALUE = PDU2 + (5, 4, 3, 1, 4)
OUTLET_STATE = PDU2 + (5, 4, 3, 1, 3)
OUTLET_DIGITS = PDU2 + (3, 5, 4, 1, 7)
SWITCH_OP = PDU2 + (4, 1, 2, 1, 2)
SWITCH_STATE = PDU2 + (4, 1, 2, 1, 3)
PDU_MODEL = PDU2 + (3, 2, 1, 1, 3, 1)
SYS_DESCR = (1, 3, 6, 1, 2, 1, 1, 1, 0)

# sensor type -> decimal digits (PDU2-MIB SensorTypeEnumeration)
CURRENT, VOLTAGE, POWER, APPARENT, PF, ENERGY, ON_OFF, FREQ = 1, 4, 5, 6, 7, 8, 14, 23
INLET_DIGITS_BY_SENSOR = {CURRENT: 3, VOLTAGE: 0, POWER: 0, APPARENT: 0, PF: 2, ENERGY: 0, FREQ: 1}
POLE_DIGITS_BY_SENSOR = {CURRENT: 3, VOLTAGE: 1, POWER: 0}
OUTLET_DIGITS_BY_SENSOR = {CURRENT: 3, VOLTAGE: 0, POWER: 0, APPARENT: 0, ENERGY: 0, ON_OFF: 0}
STATE_NORMAL, STATE_ON, STATE_OFF = 4, 7, 8
WRAP = 1 << 32


class SimulatedRaritanPdu(SnmpSimDevice):
    """A PX3-style PDU: 1 inlet, 3 poles, `outlets` outlets; see the module docstring."""

    def __init__(self, model: RackModel, name: str = "pdu-a", port: int = 0, community: str = "public",
                 nodes: list[str] | None = None, outlets_per_node: int = 2, outlets: int = 24,
                 voltage: float = 230.0, power_factor: float = 0.97, energy_start_wh: float = 0.0):
        super().__init__(port)
        self.name = name
        self.model = model
        self.nodes = list(nodes if nodes is not None else model.nodes)
        self.outlets_per_node = outlets_per_node
        self.outlet_count = max(outlets, len(self.nodes) * outlets_per_node)
        self.voltage = voltage
        self.pf = power_factor
        self._lock = threading.Lock()
        self.outlet_on = {o: True for o in range(1, self.outlet_count + 1)}
        self.outlet_energy_wh = {o: 0.0 for o in range(1, self.outlet_count + 1)}
        self.inlet_energy_wh = energy_start_wh
        self._last_time: float | None = None
        self.agent = SnmpAgent(community, self._on_set)

    # -- plug-in contract (start, stop, endpoint: SnmpSimDevice) ------------------------

    def feeds(self) -> dict[str, str]:
        """Outlet id -> node, as the inventory's `pdus[].outlets` should say."""
        return {str(o): n for n in self.nodes for o in self.node_outlets(n)}

    def node_outlets(self, node: str) -> list[int]:
        i = self.nodes.index(node)
        return [i * self.outlets_per_node + k + 1 for k in range(self.outlets_per_node)]

    def update(self, model: RackModel) -> None:
        """Advance outlet/pole/inlet values from the model; a fresh OID table is built from them at the next
        request (SnmpAgent.pending)."""
        with self._lock:
            dt = 0.0 if self._last_time is None else max(model.time - self._last_time, 0.0)
            self._last_time = model.time
            power = {o: 0.0 for o in self.outlet_on}
            for node in self.nodes:
                outs = self.node_outlets(node)
                live = [o for o in outs if self.outlet_on[o]]
                if live:
                    share = model.nodes[node].power_w / len(live)
                    for o in live:
                        power[o] = share
            for o, w in power.items():
                self.outlet_energy_wh[o] += w * dt / 3600.0
            total = sum(power.values())
            self.inlet_energy_wh += total * dt / 3600.0
            self.agent.pending = lambda: self._table_now(power, total)  # built at the next request (SnmpAgent)

    def _table_now(self, power: dict[int, float], total: float) -> OidTable:
        with self._lock:
            return self._build_table(power, total)

    # -- served table ---------------------------------------------------------------

    def _build_table(self, power: dict[int, float], total: float) -> OidTable:
        v, pf = self.voltage, self.pf
        items: dict[Oid, object] = {SYS_DESCR: text("Raritan PX3 (simulated by supernode-agent)"),
                                    PDU_MODEL: text("PX3-5190R-SIM")}

        def put(value_col: Oid, digits_col: Oid, index: Oid, sensor: int, value: float, digits: int,
                state_col: Oid | None = None, state: int = STATE_NORMAL) -> None:
            items[value_col + index + (sensor,)] = gauge(round(value * 10 ** digits))
            items[digits_col + index + (sensor,)] = gauge(digits)
            if state_col is not None:
                items[state_col + index + (sensor,)] = integer(state)

        inlet = (1, 1)
        d = INLET_DIGITS_BY_SENSOR
        put(INLET_VALUE, INLET_DIGITS, inlet, CURRENT, total / (v * pf), d[CURRENT], INLET_STATE)
        put(INLET_VALUE, INLET_DIGITS, inlet, VOLTAGE, v, d[VOLTAGE], INLET_STATE)
        put(INLET_VALUE, INLET_DIGITS, inlet, POWER, total, d[POWER], INLET_STATE)
        put(INLET_VALUE, INLET_DIGITS, inlet, APPARENT, total / pf, d[APPARENT], INLET_STATE)
        put(INLET_VALUE, INLET_DIGITS, inlet, PF, pf, d[PF], INLET_STATE)
        put(INLET_VALUE, INLET_DIGITS, inlet, FREQ, 50.0, d[FREQ], INLET_STATE)
        items[INLET_VALUE + inlet + (ENERGY,)] = gauge(math.floor(self.inlet_energy_wh))
        items[INLET_DIGITS + inlet + (ENERGY,)] = gauge(0)
        items[INLET_STATE + inlet + (ENERGY,)] = integer(STATE_NORMAL)
        for pole in (1, 2, 3):
            w = sum(p for o, p in power.items() if (o - 1) % 3 + 1 == pole)
            idx = (1, 1, pole)
            dp = POLE_DIGITS_BY_SENSOR
            put(POLE_VALUE, POLE_DIGITS, idx, CURRENT, w / (v * pf), dp[CURRENT])
            put(POLE_VALUE, POLE_DIGITS, idx, VOLTAGE, v, dp[VOLTAGE])
            put(POLE_VALUE, POLE_DIGITS, idx, POWER, w, dp[POWER])
            items[POLE_UPPER_CRIT + idx + (CURRENT,)] = gauge(32000)  # 32 A breaker, 3 digits
        do = OUTLET_DIGITS_BY_SENSOR
        for o, w in power.items():
            idx = (1, o)
            on = self.outlet_on[o]
            put(OUTLET_VALUE, OUTLET_DIGITS, idx, CURRENT, w / (v * pf), do[CURRENT], OUTLET_STATE)
            put(OUTLET_VALUE, OUTLET_DIGITS, idx, VOLTAGE, v if on else 0.0, do[VOLTAGE], OUTLET_STATE)
            put(OUTLET_VALUE, OUTLET_DIGITS, idx, POWER, w, do[POWER], OUTLET_STATE)
            put(OUTLET_VALUE, OUTLET_DIGITS, idx, APPARENT, w / pf, do[APPARENT], OUTLET_STATE)
            items[OUTLET_VALUE + idx + (ENERGY,)] = gauge(math.floor(self.outlet_energy_wh[o]))
            items[OUTLET_DIGITS + idx + (ENERGY,)] = gauge(0)
            items[OUTLET_STATE + idx + (ENERGY,)] = integer(STATE_NORMAL)
            put(OUTLET_VALUE, OUTLET_DIGITS, idx, ON_OFF, 1 if on else 0, 0, OUTLET_STATE,
                STATE_ON if on else STATE_OFF)
            items[SWITCH_OP + idx] = integer(1 if on else 0)
            items[SWITCH_STATE + idx] = integer(STATE_ON if on else STATE_OFF)
        return OidTable(items)

    # -- switching --------------------------------------------------------------------

    def _on_set(self, oid: Oid, value: object) -> object:
        if oid[:len(SWITCH_OP)] != SWITCH_OP or len(oid) != len(SWITCH_OP) + 2 or oid[-2] != 1:
            raise SetRefused(17)  # notWritable
        outlet = oid[-1]
        if outlet not in self.outlet_on:
            raise SetRefused(11)  # noCreation
        try:
            op = int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise SetRefused(7) from None  # wrongType
        if op not in (0, 1, 2):
            raise SetRefused(10)  # wrongValue
        self.switch(outlet, op != 0)  # cycle(2): off then on again, instantly here
        return integer(op)

    def switch(self, outlet: int, on: bool) -> None:
        """Set one outlet; a node with all its outlets off loses power in the model."""
        with self.model.lock:
            with self._lock:
                self.outlet_on[outlet] = on
            for node in self.nodes:
                outs = self.node_outlets(node)
                if outlet in outs:
                    self.model.nodes[node].powered = any(self.outlet_on[o] for o in outs)
            self.update(self.model)

    # -- faults -----------------------------------------------------------------------

    def counter_wrap(self, margin_wh: float = 5.0) -> None:
        """Jump the inlet and outlet energy counters to `margin_wh` below 2^32, so they wrap shortly."""
        with self._lock:
            self.inlet_energy_wh = WRAP - margin_wh
            for o in self.outlet_energy_wh:
                self.outlet_energy_wh[o] = WRAP - margin_wh
        self._republish()

    def counter_reset(self) -> None:
        """Energy counters back to 0 (an operator reset)."""
        with self._lock:
            self.inlet_energy_wh = 0.0
            for o in self.outlet_energy_wh:
                self.outlet_energy_wh[o] = 0.0
        self._republish()

    def _republish(self) -> None:
        with self.model.lock:
            self.update(self.model)  # no model time passed: only the served table changes

    def clear_faults(self) -> None:
        """Back to a healthy PDU (`sim clear`): answering, every outlet on."""
        self.set_offline(False)
        for outlet, on in list(self.outlet_on.items()):
            if not on:
                self.switch(outlet, True)

    def trip_outlet(self, outlet: int) -> None:
        """The outlet's breaker/relay opens by itself: same effect as switching it off."""
        self.switch(outlet, False)
