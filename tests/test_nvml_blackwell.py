"""What Blackwell (GB200, NVLink5) answers over NVML, and what the exporter makes of it.

The twin's GB200 personality answers the legacy NVLink error API and fields
161-163 NotSupported and serves the NVLINK_COUNT_* fields, the BER ones packed
as nvml.h packs them (NVML_NVLINK_ERROR_COUNTER_BER_GET: bits 0-7 exponent,
bits 8-11 mantissa). The twin packs with its own code, the exporter decodes
with its own: each test below would fail if either were wrong.
"""

from __future__ import annotations

import math

import pynvml
import pytest

from sim.nvml_twin import NvmlTwin, _pack_ber
from sim.nvml_personality import PERSONALITIES
from sim.rack import RackModel
from exporters.gpu import nvml_metrics as M
from exporters.model import Quality
from exporters.gpu.nvml import NvmlSource
from exporters.gpu.nvml_profile import ProfileError, decode_ber, load_profile
from tests.nvml_sim import serve
from tests.test_nvml import one, poll_close, run, values

NODE = "node01"
GPUS = 2
LINKS = 18  # NVLink5 on a GB200: 18 links per GPU


@pytest.mark.parametrize("raw, ratio", [
    (0, 0.0),
    ((1 << 8) | 11, 1e-11),   # mantissa 1, exponent 11
    ((3 << 8) | 15, 3e-15),
    ((15 << 8) | 9, 1.5e-8),  # the widest mantissa (4 bits)
    ((2 << 8) | 0, 2.0),
    (0xFFFF_F000 | (7 << 8) | 12, 7e-12),  # bits above 11 are not part of the value
])
def test_packed_ber_decodes_as_nvml_h_says(raw, ratio):
    assert decode_ber(raw) == pytest.approx(ratio, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("ratio", [1e-11, 8e-12, 4.2e-13, 1.23e-13, 9.6e-10, 1.5e-8, 3e-15, 0.0])
def test_twin_packs_ber_as_the_driver_does(ratio):
    raw = _pack_ber(ratio)
    assert raw >> 12 == 0, "only bits 0-11 carry the packed BER"
    mantissa, exponent = raw >> 8, raw & 0xFF
    assert decode_ber(raw) == pytest.approx(ratio, abs=0.5 * 10.0 ** -exponent)  # the nearest the 4 bits hold
    assert ratio == 0 or 1 <= mantissa <= 15


def test_profile_refuses_an_unknown_field_encoding(tmp_path):
    text = (load_profile.__defaults__[0]).read_text().replace("encoding: ber_packed}", "encoding: float}", 1)
    (tmp_path / "nvml.yaml").write_text(text)
    with pytest.raises(ProfileError, match=r"nvlink_fields\[\d+\]\.encoding"):
        load_profile(tmp_path / "nvml.yaml")


@pytest.fixture
def gb200():
    m = RackModel(nodes=1, gpus_per_node=GPUS, nvlinks=LINKS, seed=5, personality="gb200")
    with m.lock:
        m.gpu(NODE, 1).nvlink_error_rate[4] = 8.0  # flit errors/s on GPU 1, link 4
    m.step(10.0)
    return m


def _source(sim) -> NvmlSource:
    return NvmlSource(NvmlTwin(sim.url, NODE), GPUS, LINKS, call_timeout=5.0, xid_events=False, gpu_timeout=4.0)


def test_gb200_personality_is_nvlink5_without_the_legacy_api(gb200):
    g = gb200.gpu(NODE, 0)
    assert g.nvlink_version == pynvml.NVML_NVLINK_VERSION_5_0 and g.name == "NVIDIA GB200"
    assert "nvmlDeviceGetNvLinkErrorCounter" in g.unsupported
    with pytest.raises(ValueError, match="gpu personality: expected one of"):
        RackModel(nodes=1, gpus_per_node=1, personality="b300")
    assert set(PERSONALITIES) == {"h100", "gb200"}


def test_a_cleared_or_rebooted_gb200_still_lacks_the_legacy_nvlink_api(gb200):
    """What the model never supports comes back after `sim clear`, a reboot and an injected NotSupported."""
    from sim.nvml_faults import clear_gpu_faults, reboot_node, set_unsupported

    set_unsupported(gb200, NODE, 0, ["nvmlDeviceGetPowerUsage"])
    g = gb200.gpu(NODE, 0)
    assert {"nvmlDeviceGetNvLinkErrorCounter", "nvmlDeviceGetPowerUsage"} <= g.unsupported
    clear_gpu_faults(gb200)
    assert "nvmlDeviceGetNvLinkErrorCounter" in g.unsupported and "nvmlDeviceGetPowerUsage" not in g.unsupported
    set_unsupported(gb200, NODE, 0, ["nvmlDeviceGetPowerUsage"])
    reboot_node(gb200, NODE)
    assert g.unsupported == set(PERSONALITIES["gb200"]["unsupported"])


def test_gb200_exports_nvlink5_counters_and_no_notsupported_storm(gb200):
    """Legacy types are `unsupported` once per GPU (not per link, not per cycle); NVLink5 counters and the BER ratio flow."""
    for sim in serve(gb200):
        first, second = run(lambda: poll_close(_source(sim), n=2))
    legacy = {"replay", "recovery", "crc_flit", "crc_data", "ecc_data"}
    for res in (first, second):
        assert not res.partial_errors
        assert not {r.labels.get("type") for r in res.readings if r.spec is M.NVLINK_ERRORS and r.ok} & legacy
    unsup = [r for r in first.readings if r.quality is Quality.UNSUPPORTED]
    # per GPU: fields 161, 162, 163 and the two nvmlDeviceGetNvLinkErrorCounter counters, once each
    assert len(unsup) == 5 * GPUS, [r.reading_id() for r in unsup]
    assert all("link" not in r.labels for r in unsup)
    assert not [r for r in second.readings if r.quality is Quality.UNSUPPORTED]
    g = gb200.gpu(NODE, 1)
    flit = g.nvlink_errors[4][2]
    assert flit > 0
    for res in (first, second):
        assert one(res, M.NVLINK_ERRORS, gpu="1", link="4", type="effective") == flit
        assert one(res, M.NVLINK_ERRORS, gpu="1", link="4", type="symbol") == 4 * flit
        assert one(res, M.NVLINK_BER, gpu="1", link="4", kind="effective") == pytest.approx(8.0 / 8e11, rel=0.06)
        assert one(res, M.NVLINK_BER, gpu="1", link="4", kind="symbol") == pytest.approx(32.0 / 8e11, rel=0.06)
        assert one(res, M.NVLINK_BER, gpu="0", link="4", kind="effective") == 0.0
        for kind in ("recovery_successful", "recovery_events", "malformed_packet", "buffer_overrun", "receive",
                     "local_link_integrity", "transmit_discards", "recovery_failed"):
            assert len(values(res, M.NVLINK_ERRORS, gpu="0", type=kind)) == LINKS, kind
        bers = values(res, M.NVLINK_BER)
        assert len(bers) == 2 * GPUS * LINKS and all(0.0 <= v < 1e-6 for v in bers.values())


def test_h100_keeps_the_legacy_counters_and_drops_nvlink5_once(gb200):
    m = RackModel(nodes=1, gpus_per_node=GPUS, nvlinks=LINKS, seed=5, personality="h100")
    with m.lock:
        m.gpu(NODE, 1).nvlink_error_rate[4] = 8.0
    m.step(10.0)
    for sim in serve(m):
        first, second = run(lambda: poll_close(_source(sim), n=2))
    assert one(first, M.NVLINK_ERRORS, gpu="1", link="4", type="crc_flit") == m.gpu(NODE, 1).nvlink_errors[4][2] > 0
    assert not values(first, M.NVLINK_BER)
    nvlink5 = [f for f in load_profile().nvlink_fields if f.name.startswith("NVML_FI_DEV_NVLINK_COUNT_")]
    unsup = [r for r in first.readings if r.quality is Quality.UNSUPPORTED]
    # and the three C2C counters (an H100 SXM has no C2C link) and the fabric registration (the twin's H100 has none)
    assert len(unsup) == (len(nvlink5) + 3 + 1) * GPUS
    assert sum(r.spec is M.C2C_ERRORS for r in unsup) == 3 * GPUS
    assert sum(r.spec is M.FABRIC_STATE for r in unsup) == GPUS
    assert not [r for r in second.readings if r.quality is Quality.UNSUPPORTED]
    assert not math.isnan(one(second, M.NVLINK_ERRORS, gpu="1", link="4", type="replay"))


def test_demo_defaults_to_the_gb200_class():
    """`make demo` runs `supernode-sim demo`: its rack is GB200, so the BER panel has data."""
    import inspect

    from sim.cli import build_parser
    from sim.demo import run_demo

    assert build_parser().parse_args(["demo"]).personality == "gb200"
    assert inspect.signature(run_demo).parameters["personality"].default == "gb200"
    assert build_parser().parse_args(["run"]).personality == "h100"
    for name in PERSONALITIES:  # every model the simulator has is offered
        assert build_parser().parse_args(["demo", "--personality", name]).personality == name


def _temperature_poll(model: RackModel, missing_v: bool):
    from sim import nvml_twin

    for sim in serve(model):
        twin = NvmlTwin(sim.url, NODE)
        if missing_v:  # a driver older than nvmlDeviceGetTemperatureV: pynvml raises FunctionNotFound
            twin.nvmlDeviceGetTemperatureV = nvml_twin._not_found("nvmlDeviceGetTemperatureV")
        src = NvmlSource(twin, GPUS, LINKS, call_timeout=5.0, xid_events=False, gpu_timeout=4.0)
        return run(lambda: poll_close(src, n=2))


def test_temperature_prefers_nvmlDeviceGetTemperatureV():
    """The deprecated call answers NotSupported here: the temperature still comes, from the V call."""
    m = RackModel(nodes=1, gpus_per_node=GPUS, nvlinks=LINKS, seed=5, personality="gb200")
    with m.lock:
        for g in m.nodes[NODE].gpus:
            g.unsupported.add("nvmlDeviceGetTemperature")
    first, second = _temperature_poll(m, missing_v=False)
    for res in (first, second):
        assert one(res, M.TEMPERATURE, gpu="1", sensor="gpu") == round(m.gpu(NODE, 1).temp_c)
        assert not [r for r in res.readings if r.quality is Quality.UNSUPPORTED and r.spec is M.TEMPERATURE]


def test_temperature_falls_back_where_the_driver_lacks_the_v_call():
    m = RackModel(nodes=1, gpus_per_node=GPUS, nvlinks=LINKS, seed=5, personality="h100")
    first, second = _temperature_poll(m, missing_v=True)
    for res in (first, second):
        assert not res.partial_errors
        assert one(res, M.TEMPERATURE, gpu="0", sensor="gpu") == round(m.gpu(NODE, 0).temp_c)


def test_grace_blackwell_c2c_link_errors_are_exported(gb200):
    with gb200.lock:
        gb200.gpu(NODE, 1).c2c_errors = [7, 3, 1]
    for sim in serve(gb200):
        (res,) = run(lambda: poll_close(_source(sim)))
    assert one(res, M.C2C_ERRORS, gpu="1", type="crc") == 7
    assert one(res, M.C2C_ERRORS, gpu="1", type="replay") == 3
    assert one(res, M.C2C_ERRORS, gpu="1", type="replay_back_to_back") == 1
    assert one(res, M.C2C_ERRORS, gpu="0", type="crc") == 0
