"""The real daemon on a GB200 rack (the demo's default): NVLink5 counters and a BER ratio, no NotSupported storm.

On Blackwell the legacy NVLink error API and fields 161-163 answer NotSupported;
the agent must say so once per GPU and series (supernode_reading_quality
unsupported), count no errors for it, and export the NVLink5 counters and the
decoded BER that the dashboards' BER panel and the nvlink alert use.
"""

from __future__ import annotations

import re

from sim.demo import agent_config
from tests.agentproc import running_agent
from tests.helpers import free_port, wait_for
from sim.harness import sim_rack


def _series(text: str, family: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for m in re.finditer(rf"^{family}\{{([^}}]*)\}} (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            out.append((have, float(m.group(2))))
    return out


def test_gb200_agent_exports_ber_and_nvlink5_counters_without_an_error_storm(tmp_path):
    with sim_rack(tmp_path, nodes=1, gpus=4, personality="gb200") as rack:
        (tmp_path / "admin.token").write_text("token-for-tests\n")
        (tmp_path / "webhook.token").write_text("token-for-tests\n")
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="observe")
        cfg["sources"]["nvml"].update(timeout=3.0, gpu_timeout=2.0)
        rack.inject("nvlink-errors", node="node01", gpu=2, link=3, rate=500)
        cfg["metrics"] = {"detail": ["nvlink_link_errors", "nvlink_link_ber"]}  # every link's series, not the budget's
        with running_agent(cfg, tmp_path) as agent:
            def ber() -> float:
                found = _series(agent.metrics(), "supernode_nvlink_bit_error_rate", gpu="2", link="3", kind="effective")
                return found[0][1] if found else 0.0

            wait_for(lambda: ber() > 0, 40, what="the effective BER of gpu 2 link 3 rises")
            wait_for(lambda: len(_series(agent.metrics(), "supernode_nvlink_errors_total", type="symbol")) == 4 * 18,
                     20, what="symbol errors of every GPU's 18 links")
            text = agent.metrics()
            # 500 flit errors/s over an 800 Gbit/s link: 6.25e-10, packed to one or two digits by the twin
            assert 5e-10 <= ber() <= 7e-10
            assert [v for _, v in _series(text, "supernode_nvlink_bit_error_rate", gpu="0", kind="effective")] == [0.0] * 18
            assert not _series(text, "supernode_nvlink_errors_total", type="crc_flit")
            unsupported = [labels["reading"] for labels, v in _series(text, "supernode_reading_quality", source="nvml",
                                                                   quality="unsupported") if v == 1.0]
            for legacy in ("replay", "recovery", "crc_flit", "crc_data", "ecc_data"):
                assert sum(f"type={legacy}," in r for r in unsupported) == 4, (legacy, unsupported)
            assert not [r for r in unsupported if "link=" in r]  # once per GPU, never per link
            assert not [v for labels, v in _series(text, "supernode_source_errors_total", source="nvml") if v > 0]
            assert len(_series(text, "supernode_gpu_c2c_errors_total", type="crc")) == 4
            assert "nvml call failed" not in agent.log()
