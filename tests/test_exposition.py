"""/metrics: the whole exposition of a fixed simulated rack against a golden file, and promtool's lint.

The golden rack is frozen (no model ticks, fixed clock and durations), so
every byte of the exposition is deterministic: a renamed metric, a lost
label or a changed unit shows up as a diff. Regenerate on purpose with
`UPDATE_GOLDEN=1 make test PYTEST_ARGS=tests/test_exposition.py`.

The golden file is a change detector generated from this code, not an independent oracle (tests/golden/README.md):
it catches an unreviewed change; promtool's lint and the metric catalogue (test_catalogue.py) check correctness.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from agent.config import parse_config
from sim.demo import agent_config
from agent.exposition import build_registry, inventory_readings, render_metrics
from agent.series_budget import SeriesBudget
from sim.reference_tray import poll_all, tray_config
from sim.server import Simulator
from agent.snapshot import SnapshotStore
from agent.sources import build_sources
from tests.helpers import REPO, require_binary

GOLDEN = REPO / "tests" / "golden" / "metrics.txt"
FROZEN_TIME = 1_790_000_000.0


async def frozen_readings(tmp_path: Path) -> list:
    """Every reading of one poll of every source of the frozen rack."""
    store = await frozen_store(tmp_path)
    return list(store[0].snapshot().readings)


async def frozen_exposition(tmp_path: Path) -> bytes:
    store, loaded = await frozen_store(tmp_path)
    ident = {"rack": "r01", "node": "node01", "role": "compute", "version": "golden", "mode": "observe"}
    return render_metrics(build_registry(store, lambda: ident), store, inventory_readings(loaded.config.inventory),
                          budget=SeriesBudget().apply)  # what /metrics serves by default


async def frozen_store(tmp_path: Path):
    sim = Simulator(nodes=2, gpus=4, tick=3600.0, workdir=tmp_path / "sim", advertise=False)
    await sim.start()
    try:
        loaded = parse_config(tray_config(sim, tmp_path))
        store = SnapshotStore(clock=lambda: FROZEN_TIME)
        await poll_all(store, loaded)
        return store, loaded
    finally:
        await sim.stop()


def test_exposition_matches_golden_file(tmp_path):
    text = asyncio.run(frozen_exposition(tmp_path)).decode()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    expected = GOLDEN.read_text()
    assert text == expected, "exposition differs from tests/golden/metrics.txt (UPDATE_GOLDEN=1 to accept)"
    for family in ("supernode_gpu_power_watts", "supernode_gpu_nvlink_errors_total", "supernode_link_up",
                   "supernode_optic_rx_power_dbm", "supernode_cdu_temperature_celsius", "supernode_leak_detected",
                   "supernode_pdu_inlet_power_watts", "supernode_rack_power_watts", "supernode_source_up"):
        assert f"# TYPE {family.removesuffix('_total')}" in text, family


def test_golden_exposition_passes_promtool():
    promtool = require_binary("promtool")
    text = GOLDEN.read_bytes()
    assert len(text) > 10_000  # the whole rack, not an empty scrape (promtool accepts empty input)
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    assert out.stdout.strip() == b"" and out.stderr.strip() == b"", out.stdout + out.stderr


def test_configured_coolant_sets_heat_removed(tmp_path):
    """heat = flow x density x heat capacity x dT: the inventory's coolant, not a constant in code."""
    async def heat(density: float, cp: float) -> float:
        sim = Simulator(nodes=2, gpus=4, tick=3600.0, workdir=tmp_path / f"sim{density}", advertise=False)
        await sim.start()
        try:
            for name in ("admin.token", "webhook.token"):
                (tmp_path / name).write_text("t")
            cfg = agent_config(sim, "node01", 0, tmp_path, mode="observe")
            cdu = next(c for c in cfg["inventory"]["cdus"] if c["name"] == "cdu1")
            cdu["coolant"] = {"name": "test", "density_kg_m3": density, "heat_capacity_j_kgk": cp}
            src = next(s.source for s in build_sources(parse_config(cfg))
                       if s.source.name == "cdu" and s.source.device == "cdu1")
            result = await src.poll()
            await src.close()
            return next(r.value for r in result.readings if r.name == "supernode_cdu_heat_removed_watts")
        finally:
            await sim.stop()

    water, pg25 = asyncio.run(heat(998.0, 4182.0)), asyncio.run(heat(1025.0, 3900.0))
    assert water / pg25 == pytest.approx((998.0 * 4182.0) / (1025.0 * 3900.0), rel=1e-9)


def test_fast_text_is_byte_identical_to_prometheus_client(tmp_path):
    """render_text must say exactly what prometheus_client's generate_latest says for the same readings."""
    from exporters.model import Quality, Reading, counter, gauge
    from exporters.render import render_readings, render_text

    g = gauge("supernode_test_edge_ratio", "Edge cases: escaping \\\\ and\\nnewlines in HELP.", ("a", "b"))
    c = counter("supernode_test_edge_total", "A counter.", ("a",))
    bare = gauge("supernode_test_bare", "No labels.")
    edge = [Reading(g, float("nan"), {"a": 'quote " back \\ nl \n', "b": "x"}),
            Reading(g, float("inf"), {"a": "inf", "b": ""}), Reading(g, float("-inf"), {"a": "-inf"}),
            Reading(g, 1e21, {"a": "big", "b": "y", "zextra": "z"}), Reading(g, -0.0, {"a": "zero", "b": "z"}),
            Reading(g, 5.0, {"a": "dup", "b": "1"}), Reading(g, 6.0, {"a": "dup", "b": "1"}),
            Reading(g, 7.0, {"a": "bad", "b": "1"}, quality=Quality.SENSOR_FAULT),
            Reading(c, 12345678.9, {"a": "ü"}), Reading(bare, 0.1)]
    rack = asyncio.run(frozen_readings(tmp_path))
    for readings in (edge, rack):
        assert render_text(readings) == render_readings(readings).decode()


def test_a_probe_prints_what_metrics_shows_for_the_same_poll():
    """One renderer: every line `probe` prints (values, and the quality series of a faulty reading) is a line
    of /metrics for the same readings."""
    from agent.exposition import build_registry, render_metrics
    from agent.snapshot import SnapshotStore
    from exporters.model import Quality, Reading, gauge
    from exporters.render import render_probe

    g = gauge("supernode_test_probe_celsius", "A probed value.", ("point",))
    readings = [Reading(g, 21.5, {"point": "supply"}), Reading(g, 0.0, {"point": "return"}, Quality.SENSOR_FAULT)]
    store = SnapshotStore()
    store.register("cdu", "cdu9", 5.0, 2.0)
    store.publish("cdu", "cdu9", readings, 0.01)
    metrics = render_metrics(build_registry(store, lambda: {}), store).decode().splitlines()
    probe = render_probe("cdu", "cdu9", readings).splitlines()
    assert 'supernode_test_probe_celsius{point="supply"} 21.5' in probe
    assert any(line.startswith("supernode_reading_quality{") and 'quality="sensor_fault"' in line for line in probe)
    assert [line for line in probe if line not in metrics] == []
