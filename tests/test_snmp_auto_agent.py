"""`profile: auto` in the real daemon: each PDU's profile is chosen from what it answers (snmpsim recordings)."""

from __future__ import annotations

from tests.helpers import wait_for
from tests.snmpsim_peer import recordings, run_snmpsim
from tests.agentproc import base_config, running_agent


def test_agent_picks_each_pdu_profile_from_sysobjectid(tmp_path):
    secrets = {}
    for community in ("apc-8641", "apc-7902b", "vertiv-geist-v5", "vertiv-pdu_mn03edr1", "servertech-sentry4",
                      "entity-sensor"):
        (tmp_path / community).write_text(community + "\n")
        secrets[community] = {"file": str(tmp_path / community)}
    for port in run_snmpsim(tmp_path, recordings(), "apc-8641"):
        cfg = base_config(tmp_path)
        cfg["secrets"].update(secrets)
        cfg["inventory"] = {"pdus": [
            {"name": n, "profile": "auto", "host": "127.0.0.1", "port": port, "community_secret": n}
            for n in secrets]}
        cfg["sources"]["pdu"] = {"interval": 0.5, "timeout": 1.0}
        with running_agent(cfg, tmp_path) as agent:
            def decoded() -> str | None:
                t = agent.metrics()
                info = [line for line in t.splitlines() if line.startswith("supernode_pdu_info{")]
                done = (all(any(f'pdu="{n}"' in line for line in info) for n in secrets if n != "entity-sensor")
                        and 'kind="decode",source="pdu"' in t)
                return t if done else None
            text = wait_for(decoded, timeout=60, what="three PDUs decoded and the unknown one refused")
            assert 'profile="apc-rpdu2"' in text and 'profile="vertiv-geist-v5"' in text
            assert 'supernode_pdu_inlet_power_watts{inlet="1",pdu="apc-8641"} 1210.0' in text
            assert 'supernode_pdu_phase_voltage_volts{inlet="1",pdu="vertiv-geist-v5",phase="1"} 206.8' in text
            # the breaker circuits of the chosen profile reach the daemon's exposition (VERTIV-V5-MIB centiamps)
            assert 'supernode_pdu_breaker_current_amperes{breaker="4",pdu="vertiv-geist-v5"} 2.56' in text
            # the real walks' last tables: a Vertiv/Geist unit's inlet lines (pduLineCurrent, centiamps), an AP7902B's
            # legacy rPDUIdent apparent power, power factor and configured line-to-line voltage
            assert 'supernode_pdu_breaker_current_amperes{breaker="line2",pdu="vertiv-pdu_mn03edr1"} 12.34' in text
            assert 'supernode_pdu_inlet_apparent_power_volt_amperes{inlet="1",pdu="apc-7902b"} 192.0' in text
            assert 'supernode_pdu_inlet_nominal_voltage_volts{inlet="1",pdu="apc-7902b"} 120.0' in text
            assert 'profile="servertech-sentry4"' in text   # Sentry4-MIB lines: hundredth A, limits tenth A
            assert 'supernode_pdu_breaker_current_amperes{breaker="1.1.line1",pdu="servertech-sentry4"} 10.5' in text
            assert ('supernode_pdu_breaker_current_limit_amperes{breaker="1.1.line1",pdu="servertech-sentry4",'
                    'threshold="upper_critical"} 25.6') in text
            # a device no rule knows is that PDU's error, not a guess, and not the others' problem
            assert 'supernode_source_up{device="entity-sensor",source="pdu"} 0.0' in text
            assert 'supernode_source_errors_total{device="entity-sensor",kind="decode",source="pdu"}' in text
            assert not [line for line in text.splitlines()
                        if line.startswith("supernode_pdu_info{") and 'pdu="entity-sensor"' in line]
            assert agent.stop() in (0, None)
