"""The series budget (issue 38): what one GB200 tray costs Prometheus, pinned per family, and its rules.

The reference tray is the simulator's (sim/reference_tray.py): a real agent's whole /metrics after one poll of
every source, frozen. Its counts per family are pinned in tests/golden/series_per_family.json: a family that grows
(a new one included) fails here until someone writes the new count down on purpose
(`UPDATE_GOLDEN=1 ... tests/test_series_budget.py`, then `python -m sim.reference_tray` for docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from agent.catalogue import CATALOGUE, SERIES_MARK
from agent.config import ConfigError, parse_config
from agent.series_budget import DETAIL_GROUPS, SeriesBudget
from exporters.gpu import nvml_metrics as M
from exporters.gpu.nvlink_rollup import gpu_rollups
from exporters.links.dom import OPTIC_ALARM, OPTIC_ALARMS_READ, Flag, ModuleDom, module_readings
from exporters.model import Quality, Reading
from sim.demo import agent_config
from sim.harness import sim_rack
from sim.reference_tray import counts, render_section
from tests.agentproc import running_agent
from tests.helpers import REPO, free_port, wait_for

PINNED = REPO / "tests" / "golden" / "series_per_family.json"
BUDGET = 1_500  # series of one tray's own (its GPUs, links, optics, BMC, the agent itself), by default


@pytest.fixture(scope="module")
def tray_counts():
    return asyncio.run(counts())


def test_series_per_family_of_the_reference_tray_are_pinned(tray_counts):
    got = {k: tray_counts[k] for k in ("quiet", "faulted", "detail", "quiet_shared")}
    if os.environ.get("UPDATE_GOLDEN"):
        PINNED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    pinned = json.loads(PINNED.read_text())
    for key in ("quiet", "faulted", "detail"):
        grew = {n: (pinned[key].get(n, 0), c) for n, c in got[key].items() if c != pinned[key].get(n, 0)}
        gone = sorted(set(pinned[key]) - set(got[key]))
        assert not grew and not gone, (
            f"{key} tray: series per family changed {grew} (pinned, now), gone {gone}: if on purpose, "
            "UPDATE_GOLDEN=1 this test and `python -m sim.reference_tray` (docs/metrics.md)")


def test_the_tray_keeps_within_its_budget_and_the_detail_stays_available(tray_counts):
    quiet, faulted, detail = tray_counts["quiet"], tray_counts["faulted"], tray_counts["detail"]
    assert sum(quiet.values()) - tray_counts["quiet_shared"] <= BUDGET
    assert sum(faulted.values()) - tray_counts["faulted_shared"] <= BUDGET
    # per-link detail only where it informs: the erroring link's ten types, its BER; the raised flags only
    assert quiet.get(M.NVLINK_ERRORS.name, 0) == 0 and faulted[M.NVLINK_ERRORS.name] == 10
    assert quiet.get(M.NVLINK_BER.name, 0) == 0 and faulted[M.NVLINK_BER.name] == 2
    assert quiet.get(OPTIC_ALARM.name, 0) == 0 and 0 < faulted[OPTIC_ALARM.name] < detail[OPTIC_ALARM.name]
    # the roll-ups always: 4 GPUs x 10 types, and each of the 4 modules says its flags were read
    assert quiet[M.GPU_NVLINK_ERRORS.name] == 40 and quiet[OPTIC_ALARMS_READ.name] == 4
    # the switch brings every series back: 4 GPUs x 18 links x 10 types, 2 BER kinds, 4 modules' 320 flags
    assert detail[M.NVLINK_ERRORS.name] == 720 and detail[M.NVLINK_BER.name] == 144
    assert detail[M.NVLINK_TX.name] == detail[M.NVLINK_REMOTE.name] == 72 and detail[OPTIC_ALARM.name] == 320


def test_docs_state_the_counts_of_the_reference_tray(tray_counts):
    text = CATALOGUE.read_text()
    assert SERIES_MARK in text
    assert SERIES_MARK + text.split(SERIES_MARK, 1)[1] == render_section(tray_counts), \
        "docs/metrics.md's series section is stale: python -m sim.reference_tray"


def _err(gpu: str, link: str, kind: str, value: float) -> Reading:
    return Reading(M.NVLINK_ERRORS, value, {"gpu": gpu, "uuid": f"u{gpu}", "link": link, "type": kind})


def _exported(budget: SeriesBudget, readings: list[Reading], detail=()) -> set[tuple]:
    return {(r.name, *sorted(r.labels.items())) for r in budget.apply(readings, detail)}


def test_a_link_with_errors_keeps_all_its_types_from_then_on():
    budget = SeriesBudget()
    quiet = [_err(g, str(link), k, 0.0) for g in "01" for link in range(3) for k in ("crc_flit", "replay")]
    assert not _exported(budget, quiet)
    erring = [_err("1", "2", "replay", 4.0) if (r.label("gpu"), r.label("link"), r.label("type")) == ("1", "2", "replay")
              else r for r in quiet]
    shown = _exported(budget, erring)
    links = {(dict(s[1:])["gpu"], dict(s[1:])["link"]) for s in shown}
    assert links == {("1", "2")} and len(shown) == 2  # both types of that link, and only that link
    # a GPU reset zeroes the counters: the link's series stay (a counter reset), they do not disappear
    assert _exported(budget, quiet) == shown
    # a new budget (an agent restart) forgets a link whose counters were zeroed meanwhile
    assert not _exported(SeriesBudget(), quiet)


def test_optic_flags_only_while_raised_and_the_detail_switch():
    budget = SeriesBudget()
    flags = [Reading(OPTIC_ALARM, v, {"port": "eth0", "alarm": a, "lane": "1"})
             for a, v in (("rx_power_low_alarm", 1.0), ("rx_power_high_alarm", 0.0))]
    assert {s[1] for s in _exported(budget, flags)} == {("alarm", "rx_power_low_alarm")}
    assert len(_exported(budget, flags, ["optic_alarms"])) == 2
    tx = [Reading(M.NVLINK_TX, 5.0, {"gpu": "0", "uuid": "u0", "link": "0"})]
    assert not _exported(budget, tx) and _exported(budget, tx, ["nvlink_link_traffic"])


def test_gpu_state_sets_only_their_active_members_and_the_detail_switch():
    """The recovery action and fabric state (one member is 1) and the clock-event flags: what reads 1 is exported,
    the zeros beside it only with the detail on (the rules compare with == 1)."""
    budget = SeriesBudget()
    gpu = {"gpu": "0", "uuid": "u0"}
    sets = [Reading(M.RECOVERY, 1.0 if a == "none" else 0.0, {**gpu, "action": a}) for a in ("none", "gpu_reset")]
    sets += [Reading(M.FABRIC_STATE, 1.0 if st == "completed" else 0.0, {**gpu, "state": st})
             for st in ("completed", "in_progress")]
    sets += [Reading(M.CLOCK_EVENT, v, {**gpu, "reason": why}) for why, v in (("gpu_idle", 1.0), ("hw_slowdown", 0.0))]
    member = {"action", "state", "reason"}
    assert {v for s in _exported(budget, sets) for k, v in s[1:] if k in member} == {"none", "completed", "gpu_idle"}
    assert len(_exported(budget, sets, ["gpu_state_sets"])) == 6


def test_no_alarm_is_told_apart_from_flags_not_read():
    read = ModuleDom(temperature=40.0)  # a module with DOM values but no flags printed
    assert [r.value for r in module_readings("eth0", read) if r.spec is OPTIC_ALARMS_READ] == [0.0]
    read.flags = [Flag("rx_power", "low", "alarm", "1", False)]
    assert [r.value for r in module_readings("eth0", read) if r.spec is OPTIC_ALARMS_READ] == [1.0]
    assert not [r for r in module_readings("eth0", ModuleDom()) if r.spec is OPTIC_ALARMS_READ]  # no DOM at all


def test_gpu_rollups_sum_the_links_and_never_a_partial_total():
    links = [_err("0", str(i), "crc_flit", float(i)) for i in range(18)]
    links.append(Reading(M.NVLINK_ERRORS, 0.0, {"gpu": "0", "uuid": "u0", "type": "crc_data"}, Quality.UNSUPPORTED))
    ber = [Reading(M.NVLINK_BER, v, {"gpu": "0", "uuid": "u0", "link": str(i), "kind": "effective"})
           for i, v in enumerate((0.0, 3e-12, 1e-15))]
    out = {(r.name, r.label("type") or r.label("kind")): r for r in gpu_rollups(links + ber)}
    assert out[(M.GPU_NVLINK_ERRORS.name, "crc_flit")].value == sum(range(18))
    assert (M.GPU_NVLINK_ERRORS.name, "crc_data") not in out  # a type the GPU lacks has no total
    assert out[(M.GPU_NVLINK_BER_MAX.name, "effective")].value == 3e-12
    stale = links[:17] + [_err("0", "17", "crc_flit", float("nan"))]
    stale[-1] = Reading(M.NVLINK_ERRORS, 1.0, stale[-1].labels, Quality.STALE)
    total = next(r for r in gpu_rollups(stale) if r.spec is M.GPU_NVLINK_ERRORS)
    assert total.quality is Quality.STALE  # 17 of 18 links is not the GPU's count


def test_an_unknown_detail_group_is_refused_by_name(tmp_path):
    cfg = {"agent": {"rack": "r01", "node": "node01", "state_dir": str(tmp_path / "state")},
           "metrics": {"detail": ["nvlink_link_errors", "nvlink_errors_per_link"]}}
    with pytest.raises(ConfigError) as exc:
        parse_config(cfg, "agent.yaml")
    assert "metrics.detail" in str(exc.value) and "nvlink_errors_per_link" in str(exc.value)
    assert all(g in str(exc.value) for g in DETAIL_GROUPS)
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, "-m", "agent.cli", "check-config", str(path)], capture_output=True,
                         text=True, cwd=REPO)
    assert out.returncode == 1 and "metrics.detail" in out.stderr and "nvlink_errors_per_link" in out.stderr
    cfg["metrics"]["detail"] = list(DETAIL_GROUPS)
    assert parse_config(cfg).config.metrics.detail == list(DETAIL_GROUPS)


def _families(text: str, family: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) for m in re.finditer(rf"^{family}\{{([^}}]*)\}} ", text, re.M)]


def test_the_live_agent_budgets_metrics_while_its_detector_reads_every_link(tmp_path):
    """A real agent on a GB200 rack, one link storming: /metrics carries that link's detail and every GPU's
    totals, the NVLink detector (which reads the snapshot) opens its incident naming the GPU, and a reload
    with the detail switch on brings every link's counters back without a restart."""
    with sim_rack(tmp_path, nodes=1, gpus=4, personality="gb200") as rack:
        for name in ("admin.token", "webhook.token"):
            (tmp_path / name).write_text("token-for-tests\n")
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="observe")
        cfg["sources"]["nvml"].update(timeout=3.0, gpu_timeout=2.0)
        rack.inject("nvlink-errors", node="node01", gpu=2, link=3, rate=500)
        with running_agent(cfg, tmp_path) as agent:
            def incident() -> list[dict]:
                status, body = agent.get("/api/v1/incidents", token="token-for-tests")
                assert status == 200, body
                return [i for i in json.loads(body)["open"] if i["detector"] == "nvlink_errors"]

            opened = wait_for(incident, 60, what="the nvlink_errors incident from the snapshot")
            assert opened[0]["targets"]["gpu"] == "2"
            text = agent.metrics()
            links = {(s["gpu"], s["link"]) for s in _families(text, M.NVLINK_ERRORS.name)}
            assert links == {("2", "3")}, links
            totals = _families(text, M.GPU_NVLINK_ERRORS.name)
            assert {s["gpu"] for s in totals} == {"0", "1", "2", "3"}
            agent.write_config({**cfg, "metrics": {"detail": ["nvlink_link_errors"]}})
            status, body = agent.request("POST", "/-/reload", token="token-for-tests")
            assert status == 200, body
            wait_for(lambda: len({(s["gpu"], s["link"]) for s in _families(agent.metrics(), M.NVLINK_ERRORS.name)})
                     == 4 * 18, 20, what="every link's counters after the reload")
