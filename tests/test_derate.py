"""Derate by margin (issue 35): the pure plan of agent/remediation/derate.py.

Properties, with hypothesis: the cuts sum to at least the shed whenever the GPUs can give it; no GPU goes
below its minimum limit; a hotter GPU is never cut less than a cooler one unless it already sits at its
minimum. And the loop's capacity against hand-computed figures.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.remediation.derate import GpuMargin, loop_capacity, loop_inputs, plan_cuts, plan_limits, plan_rack

SUPPLY = 30.0


@st.composite
def node(draw) -> list[GpuMargin]:
    n = draw(st.integers(1, 8))
    out = []
    for i in range(n):
        lo = draw(st.floats(100.0, 400.0))
        power = draw(st.floats(0.0, 1000.0))
        temp = draw(st.floats(SUPPLY - 5.0, 95.0))
        out.append(GpuMargin(str(i), power, temp, lo))
    return out


@given(node(), st.floats(0.0, 5000.0))
def test_the_cuts_reach_the_shed_when_feasible_and_no_gpu_goes_below_its_minimum(gpus, shed):
    cuts = plan_cuts(gpus, shed, SUPPLY)
    limits = plan_limits(gpus, shed, SUPPLY)
    headroom = sum(max(g.power_w - g.min_w, 0.0) for g in gpus)
    if headroom >= shed:
        assert sum(cuts.values()) >= shed * (1 - 1e-9) - 1e-9
    else:  # infeasible: every GPU at its minimum (or below it already, left where it is)
        assert sum(cuts.values()) == pytest.approx(headroom)
    for g in gpus:
        assert cuts[g.key] >= 0
        assert limits[g.key] >= g.min_w
        assert cuts[g.key] <= max(g.power_w - g.min_w, 0.0) + 1e-9


@given(node(), st.floats(0.0, 5000.0))
def test_a_hotter_gpu_is_never_cut_less_than_a_cooler_one_unless_at_its_minimum(gpus, shed):
    cuts = plan_cuts(gpus, shed, SUPPLY)
    for hot in gpus:
        at_min = cuts[hot.key] >= max(hot.power_w - hot.min_w, 0.0) - 1e-9
        if at_min:
            continue
        for cool in gpus:
            if cool.temp_c < hot.temp_c:
                assert cuts[hot.key] >= cuts[cool.key] - 1e-6, (hot, cool, cuts)


def test_no_shed_no_cut():
    gpus = [GpuMargin("0", 600.0, 70.0, 200.0), GpuMargin("1", 600.0, 50.0, 200.0)]
    assert plan_cuts(gpus, 0.0, SUPPLY) == {"0": 0.0, "1": 0.0}


def test_the_hotter_gpu_takes_the_larger_share_in_proportion_to_its_rise():
    gpus = [GpuMargin("hot", 600.0, 70.0, 200.0), GpuMargin("cool", 600.0, 50.0, 200.0)]
    cuts = plan_cuts(gpus, 300.0, SUPPLY)
    assert cuts["hot"] == pytest.approx(200.0, rel=1e-6)  # rise 40 K against 20 K: two thirds of the shed
    assert cuts["cool"] == pytest.approx(100.0, rel=1e-6)


def test_the_loop_capacity_is_flow_rho_cp_times_the_allowed_rise():
    # 8.4 L/min of PG25 (1025 kg/m^3, 3900 J/(kg K)) rising 17.4 K carries 9.75 kW; within 10 K, 5.6 kW
    flow = 8.4 / 60000
    cap = loop_capacity(flow, 25.0, 42.4, max_delta_t_c=10.0, max_return_c=50.0)
    assert cap is not None
    assert cap.load_w == pytest.approx(flow * 1025 * 3900 * 17.4)
    assert cap.capacity_w == pytest.approx(flow * 1025 * 3900 * 10.0)
    assert cap.shed_fraction == pytest.approx(1 - 10.0 / 17.4)
    hot = loop_capacity(flow, 45.0, 52.0, max_delta_t_c=10.0, max_return_c=50.0)  # supply hot: 5 K left
    assert hot is not None and hot.delta_t_allowed_c == pytest.approx(5.0)
    assert loop_capacity(flow, 25.0, 30.0).shed_fraction == 0.0  # within the rise: nothing to shed
    assert loop_capacity(0.0, 25.0, 30.0) is None  # no flow: the load is unknown, not zero
    assert loop_capacity(flow, 25.0, 25.0) is None


def test_missing_loop_inputs_say_which():
    assert loop_inputs({"flow_cubic_meters_per_second": 1e-4, "supply_celsius": 25.0}) == (
        "the incident carries no return_celsius (the CDU did not report it)")
    assert loop_inputs({"flow_cubic_meters_per_second": 1e-4, "supply_celsius": 25.0, "return_celsius": 35.0}) == (
        1e-4, 25.0, 35.0)


def test_a_re_planned_cap_is_one_effect_after_a_restart_and_its_undo_ends_every_re_run():
    """The journal after a crash: the first apply's `before` (the limit before any cap), the last re-run's value,
    held by the first apply's id (what the recovery's undo looks for); an undo of the first ends them all."""
    from agent.remediation.journal_file import Entry
    from agent.remediation.ownership import rebuild_effects

    def result(seq: int, aid: str, detail: dict, result: str = "done") -> Entry:
        return Entry(seq, float(seq), "result", aid, "inc1", "coolant-degraded", "gpu_power_cap", "gpu=2,node=node01",
                     result, detail)
    first = result(1, "A", {"phase": "apply", "before": {"limit_watts": 700.0, "owned": True},
                            "after": {"limit_watts": 348.0}})
    rerun = result(2, "R", {"phase": "apply", "before": {"limit_watts": 348.0, "owned": True},
                            "after": {"limit_watts": 300.0}, "rerun_of": "A"})
    effects = rebuild_effects([first, rerun])
    eff = effects[("gpu_power_cap", "gpu=2,node=node01")]
    assert eff["before"]["limit_watts"] == 700.0 and eff["after"]["limit_watts"] == 300.0
    assert eff["holders"] == {"inc1": "A"}
    undo = result(3, "U", {"phase": "undo", "apply_action_id": "A"}, "undone")
    assert rebuild_effects([first, rerun, undo]) == {}


def test_a_second_incidents_lower_cap_of_the_same_gpu_is_the_effects_value_after_a_restart_too():
    """The loop's Modbus and Redfish CDU open one coolant incident each and plan from slightly different readings:
    the second lands a lower limit over the first's. The undo must look for that value (the one the GPU has), or
    the last undo finds "not the value we set" and leaves the GPU capped for good; a skipped second apply (its
    limit was higher) changes nothing."""
    from agent.remediation.journal_file import Entry
    from agent.remediation.ownership import rebuild_effects

    def result(seq: int, aid: str, inc: str, detail: dict) -> Entry:
        return Entry(seq, float(seq), "result", aid, inc, "coolant-degraded", "gpu_power_cap", "gpu=1,node=node02",
                     "done", detail)
    first = result(1, "A", "modbus", {"phase": "apply", "before": {"limit_watts": 700.0, "owned": True},
                                      "after": {"limit_watts": 322.0}})
    lower = result(2, "B", "redfish", {"phase": "apply", "before": {"limit_watts": 700.0, "owned": True},
                                       "after": {"limit_watts": 317.0}})
    eff = rebuild_effects([first, lower])[("gpu_power_cap", "gpu=1,node=node02")]
    assert eff["before"]["limit_watts"] == 700.0 and eff["after"]["limit_watts"] == 317.0
    assert eff["holders"] == {"modbus": "A", "redfish": "B"}
    higher = result(2, "B", "redfish", {"phase": "apply", "before": {"limit_watts": 322.0, "owned": False},
                                        "after": {"limit_watts": 322.0}, "skipped": True})
    eff = rebuild_effects([first, higher])[("gpu_power_cap", "gpu=1,node=node02")]
    assert eff["after"]["limit_watts"] == 322.0 and eff["holders"] == {"modbus": "A", "redfish": "B"}
    # the second's first apply skipped, its re-plan the first to lower the limit: it holds the cap under its first
    # apply's id, the one its undo looks for (a re-run's own id would leave the cap held for ever)
    replan = result(3, "B2", "redfish", {"phase": "apply", "before": {"limit_watts": 322.0, "owned": True},
                                          "after": {"limit_watts": 275.0}, "rerun_of": "B"})
    eff = rebuild_effects([first, replan])[("gpu_power_cap", "gpu=1,node=node02")]
    assert eff["holders"] == {"modbus": "A", "redfish": "B"} and eff["after"]["limit_watts"] == 275.0


@pytest.mark.parametrize("params, named", [({"max_delta_t_celsius": -3}, "max_delta_t_celsius"),
                                           ({"fallback_fraction": 1.5}, "fallback_fraction"),
                                           ({"max_delta": 3}, "unknown parameter(s) max_delta")])
def test_a_bad_thermal_margin_parameter_is_refused_at_playbook_load_naming_it(params, named):
    from pydantic import ValidationError

    from agent.remediation.playbooks import Playbook

    with pytest.raises(ValidationError, match=re.escape(named)):
        Playbook.model_validate({"name": "x", "trigger": {"detector": "coolant_flow_low"},
                                 "steps": [{"action": "gpu_power_cap", "targets": "rack_gpus",
                                            "params": {"mode": "thermal_margin", **params}}]})


def loop(flow: float, at: float):
    """A snapshot of cdu1's secondary loop (flow, supply 25 C, return 42 C) at time `at`: what watch_derates reads."""
    from agent.snapshot import Snapshot
    from exporters.cooling import modbus_metrics as mm
    from exporters.model import Quality, Reading

    rs = [Reading(mm.FLOW, flow, {"cdu": "cdu1", "loop": "secondary"}, Quality.OK, at),
          Reading(mm.TEMPERATURE, 25.0, {"cdu": "cdu1", "loop": "secondary", "point": "supply"}, Quality.OK, at),
          Reading(mm.TEMPERATURE, 42.0, {"cdu": "cdu1", "loop": "secondary", "point": "return"}, Quality.OK, at)]
    return Snapshot(at, tuple(rs), (), monotonic=at)


def test_a_re_plan_never_raises_a_limit_another_kind_of_incident_holds_and_does_once_it_is_gone(tmp_path):
    """The engine with the NVML twin over HTTP: a hot GPU's cap (gpu_thermal) holds GPU 1 when the loop's derate
    is re-planned for a loop that recovered in part: nothing is raised; once that incident is gone, it is."""
    import asyncio

    from agent.remediation.engine import Executors
    from sim.nvml_twin import NvmlTwin
    from sim.rack import RackModel
    from tests.helpers import await_for
    from tests.remediation_support import engine, inventory, nvml_twin_server, results

    def limits(model) -> list[int]:
        return [g.power_limit_mw for g in model.nodes["node01"].gpus]

    async def main():
        model = RackModel(nodes=2, gpus_per_node=2)
        runner, url = await nvml_twin_server(model)
        lib = NvmlTwin(url, "node01")
        await asyncio.to_thread(lib.nvmlInit)
        eng = engine(tmp_path, executors=Executors(gpu_libs={"node01": lib}), inv=inventory(gpus=2))
        await eng.start()
        hot = eng.fire("gpu_thermal", {"node": "node01", "gpu": "1"}, "warning")
        await await_for(lambda: hot.state == "mitigated")
        assert limits(model)[1] == 525_000
        # half the flow the load needs within 10 K: about 41 % to shed, both GPUs below the hot cap
        flow = 5e-5
        inc = eng.fire("coolant_flow_low", {"cdu": "cdu1"}, "critical",
                       detail={"flow_cubic_meters_per_second": flow, "supply_celsius": 25.0, "return_celsius": 42.0})
        await await_for(lambda: inc.state == "mitigated", what="the derate applied")
        first = limits(model)
        assert first[0] < 525_000 and first[1] < 525_000
        eng.watch_derates(loop(flow * 1.3, 0.0))  # the loop carries more: the share to shed falls
        eng.watch_derates(loop(flow * 1.3, 100.0))
        await await_for(lambda: len(results(eng, kind="result", action="gpu_power_cap", incident_id=inc.id)) >= 4,
                        what="the re-plan ran on both GPUs")
        assert limits(model) == first  # GPU 1 is also gpu_thermal's: the re-plan raises nothing
        eng.clear("gpu_thermal", {"node": "node01", "gpu": "1"})
        await await_for(lambda: all(hot.id not in e["holders"] for e in eng.effects.values()),
                        what="the hot GPU's incident let go of its cap (kept: the derate holds it)")
        eng.watch_derates(loop(flow * 1.6, 200.0))
        await await_for(lambda: all(w > f for w, f in zip(limits(model), first)), what="raised once it is ours alone")
        await eng.stop()
        await runner.cleanup()
    asyncio.run(main())



def test_a_re_plan_still_in_flight_when_the_loop_recovers_is_undone_with_the_rest(tmp_path):
    """The engine with the NVML twin over HTTP: the loop recovers (the incident clears) right after a re-plan of its
    derate was started. The undo waits for it: every limit ends where it was before the first cap, and nothing is
    left held (a re-plan's write landing after the undo's would leave a GPU capped by a resolved incident)."""
    import asyncio

    from agent.remediation.engine import Executors
    from sim.nvml_twin import NvmlTwin
    from sim.rack import RackModel
    from tests.helpers import await_for
    from tests.remediation_support import engine, inventory, nvml_twin_server, results

    async def main():
        model = RackModel(nodes=2, gpus_per_node=2)
        runner, url = await nvml_twin_server(model)
        lib = NvmlTwin(url, "node01")
        await asyncio.to_thread(lib.nvmlInit)
        eng = engine(tmp_path, executors=Executors(gpu_libs={"node01": lib}), inv=inventory(gpus=2))
        await eng.start()
        before = [g.power_limit_mw for g in model.nodes["node01"].gpus]
        flow = 5e-5
        inc = eng.fire("coolant_flow_low", {"cdu": "cdu1"}, "critical",
                       detail={"flow_cubic_meters_per_second": flow, "supply_celsius": 25.0, "return_celsius": 42.0})
        await await_for(lambda: inc.state == "mitigated", what="the derate applied")
        assert all(g.power_limit_mw < b for g, b in zip(model.nodes["node01"].gpus, before))
        eng.watch_derates(loop(flow * 0.7, 0.0))
        eng.watch_derates(loop(flow * 0.7, 100.0))  # less flow still: a deeper cut, re-planned...
        eng.clear("coolant_flow_low", {"cdu": "cdu1"})  # ...as the loop recovers, before the re-plan ran
        await await_for(lambda: not eng.effects and not eng.tasks, what="the undo done and every task over")
        assert [g.power_limit_mw for g in model.nodes["node01"].gpus] == before
        undone = results(eng, kind="result", action="gpu_power_cap", incident_id=inc.id, result="undone")
        assert len(undone) == 2
        # no cap of this incident is written after its undo began (the journal in the order the engine acted)
        rows = [e for e in results(eng, kind="result", action="gpu_power_cap", incident_id=inc.id)]
        first_undo = min(i for i, e in enumerate(rows) if e.detail.get("phase") == "undo")
        assert [e.target for e in rows[first_undo:] if e.detail.get("phase") == "apply"] == []
        await eng.stop()
        await runner.cleanup()
    asyncio.run(main())


# -- across the rack's trays (plan_rack) ----------------------------------------------------------------------


@st.composite
def rack_of_trays(draw) -> dict[str, list[GpuMargin]]:
    """Trays of GPUs as their summaries give them: power, rise over the supply (temp_c here), minimum limit."""
    out = {}
    for t in range(draw(st.integers(1, 5))):
        gpus = []
        for i in range(draw(st.integers(1, 4))):
            lo = draw(st.floats(100.0, 400.0))
            gpus.append(GpuMargin(str(i), draw(st.floats(0.0, 1200.0)), draw(st.floats(-5.0, 70.0)), lo))
        out[f"node{t + 1:02d}"] = gpus
    return out


@given(rack_of_trays(), st.floats(0.0, 1.0), st.floats(0.0, 3000.0), st.randoms())
def test_the_rack_plan_sheds_the_racks_share_by_margin_none_below_minimum_the_same_in_any_order(trays, shed, floor,
                                                                                              rnd):
    shed_w, cuts = plan_rack(trays, shed, floor)
    power = sum(g.power_w for gs in trays.values() for g in gs)
    headroom = sum(max(g.power_w - g.min_w, 0.0) for gs in trays.values() for g in gs)
    assert shed_w == pytest.approx(max(shed * power, floor))
    total = sum(c for per in cuts.values() for c in per.values())
    if headroom >= shed_w:  # the total is the computed shed, never more (within the bisection's precision)
        assert shed_w * (1 - 1e-9) - 1e-9 <= total <= shed_w * (1 + 1e-6) + 1e-6
    else:
        assert total == pytest.approx(headroom)
    flat = [(n, g, cuts[n][g.key]) for n, gs in trays.items() for g in gs]
    for n, g, cut in flat:
        assert 0.0 <= cut <= max(g.power_w - g.min_w, 0.0) + 1e-9  # no GPU below its minimum limit
    for n, hot, cut in flat:  # a hotter GPU, on any tray, is cut at least as much unless it sits at its minimum
        if cut >= max(hot.power_w - hot.min_w, 0.0) - 1e-9:
            continue
        assert all(cut >= other - 1e-6 for _, cool, other in flat if cool.temp_c < hot.temp_c)
    # Each agent holds the trays in the order it got them: the same plan, to the last bit.
    shuffled = list(trays.items())
    rnd.shuffle(shuffled)
    again = plan_rack({n: rnd.sample(gs, len(gs)) for n, gs in shuffled}, shed, floor)
    assert again == (shed_w, cuts)


def test_the_hotter_tray_sheds_more_and_the_trays_cuts_sum_to_the_racks_shed():
    trays = {"node01": [GpuMargin("0", 600.0, 20.0, 200.0), GpuMargin("1", 600.0, 20.0, 200.0)],
             "node02": [GpuMargin("0", 600.0, 40.0, 200.0), GpuMargin("1", 600.0, 40.0, 200.0)]}
    shed_w, cuts = plan_rack(trays, 0.25, 0.0)
    assert shed_w == pytest.approx(600.0)
    assert sum(cuts["node02"].values()) == pytest.approx(400.0, rel=1e-6)  # twice the rise: twice the cut
    assert sum(cuts["node01"].values()) == pytest.approx(200.0, rel=1e-6)
    # over the PDU budget by more than the loop asks: the rack sheds at least that
    assert plan_rack(trays, 0.25, 900.0)[0] == 900.0
