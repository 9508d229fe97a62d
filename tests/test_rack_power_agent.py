"""The rack's power with two PDUs, in a real agent process: their sum while both answer; unknown (no series, a
warning in the log) while one of them does not, never the other's half presented as the rack's power; the sum
again once it answers. The demo rack's pdu-a comes from the simulator; pdu-b (node02's feed) is a second simulated
Raritan PDU served from this test's process."""

from __future__ import annotations

import asyncio
import re
import threading
from contextlib import contextmanager
from typing import Iterator

from sim.demo import agent_config
from sim.harness import sim_rack
from sim.snmp_pdu import SimulatedRaritanPdu
from tests.agentproc import running_agent, series_value
from tests.helpers import free_port, wait_for


@contextmanager
def served(pdu: SimulatedRaritanPdu) -> Iterator[SimulatedRaritanPdu]:
    """The PDU answering SNMP on its own event loop thread, its values taken from the rack model once."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="pdu-b", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(pdu.start(), loop).result(10)
        pdu.update(pdu.model)
        yield pdu
    finally:
        asyncio.run_coroutine_threadsafe(pdu.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_rack_power_is_unknown_while_one_of_two_pdus_does_not_answer(tmp_path):
    with sim_rack(tmp_path) as rack, served(SimulatedRaritanPdu(rack.sim.model, name="pdu-b",
                                                                nodes=["node02"])) as pdu_b:
        for name in ("admin.token", "webhook.token"):
            (tmp_path / name).write_text("token-for-tests\n")
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="observe")
        pdu_a = cfg["inventory"]["pdus"][0]
        cfg["inventory"]["pdus"].append({**pdu_a, "name": "pdu-b", "port": pdu_b.endpoint[1],
                                         "outlets": pdu_b.feeds()})
        cfg["sources"]["pdu"]["timeout"] = 2.0  # both PDUs are served by test processes on a loaded host

        def inlets() -> tuple[float | None, float | None, float | None]:
            text = agent.metrics()
            return (series_value(text, "supernode_pdu_inlet_power_watts", pdu="pdu-a"),
                    series_value(text, "supernode_pdu_inlet_power_watts", pdu="pdu-b"),
                    series_value(text, "supernode_rack_power_watts"))

        with running_agent(cfg, tmp_path) as agent:
            a, b, total = wait_for(lambda: (v := inlets())[2] is not None and None not in v and v, 30,
                                   what="rack power from both PDUs")
            assert a > 0 and b > 0 and total > a
            pdu_b.set_offline(True)
            # pdu-b's readings go stale; pdu-a's keep coming: the rack's power is unknown (from the derived source's
            # next poll on), not pdu-a's share of it
            wait_for(lambda: (v := inlets())[1] is None and v[0] is not None and v[2] is None, 30,
                     what="no rack power while pdu-b is stale and pdu-a reports")
            wait_for(lambda: "rack power unknown" in agent.log(), 10, what="the warning naming pdu-b")
            assert re.search(r'rack power unknown.*pdus=\S*pdu-b', agent.log()), agent.log()[-2000:]
            pdu_b.set_offline(False)
            wait_for(lambda: inlets()[2] is not None, 30, what="the rack's power again once pdu-b answers")
            assert "rack power summed again" in agent.log()
