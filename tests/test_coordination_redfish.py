"""Rack coordination of the Redfish source: a Redfish CDU is a shared device, a tray BMC is its own node's, and the
other trays that `watch_rack_trays` reads follow the elected leader. Against a real etcd and the simulator's
Redfish services over HTTPS, with the production coordinator, sources and runners in this process (driven poll
by poll, so nothing depends on timing); what each service sees is read from the simulated service itself.
"""

from __future__ import annotations

import asyncio
import types

import pytest

from agent.config import parse_config
from agent.coordination.etcd_rack import EtcdCoordinator
from agent.coordination.shared import leader_jobs, shared_devices
from sim.demo import agent_config
from agent.derived import LeakWatchSource
from agent.runtime import SourceRunner
from agent.snapshot import SnapshotStore
from agent.sources import build_sources
from tests.etcd import running_etcd
from tests.helpers import await_for
from sim.harness import SimRack

NODES = ("node01", "node02")


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    yield from running_etcd(tmp_path_factory.mktemp("etcd-redfish"), 1)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    rack = SimRack(tmp_path_factory.mktemp("sim-redfish"), nodes=2, gpus=1).start()
    try:
        yield rack
    finally:
        rack.stop()


def _loaded(sim, tmp_path, node: str, etcd=None, prefix: str = "/rf", **coordination):
    work = tmp_path / node
    work.mkdir(exist_ok=True)
    for name in ("admin.token", "webhook.token"):
        (work / name).write_text("t\n")
    cfg = agent_config(sim.sim, node, 0, work, mode="observe")
    cfg["sources"]["redfish"].update(watch_rack_trays=True)
    if etcd is not None:
        cfg["coordination"] = {"backend": "etcd", "lease_ttl_seconds": 2.0, **coordination,
                               "etcd": {"endpoints": etcd.endpoints, "prefix": prefix}}
        etcd.authorize(cfg, work)
    return parse_config(cfg)


class Agent:
    """One agent's Redfish runners and coordinator, polled by hand."""

    def __init__(self, loaded):
        self.loaded = loaded
        self.node = loaded.config.agent.node
        self.store = SnapshotStore()
        self.runners = {f"{s.source.name}/{s.source.device}": SourceRunner(s.source, s.settings, self.store, 2.0)
                        for s in build_sources(loaded) if s.source.name == "redfish"}
        self.asked: list[str] = []  # poll_now calls from the coordinator
        self.coord = EtcdCoordinator(loaded)
        self.coord.gate_runners(self.runners)

    async def start(self) -> None:
        await self.coord.start(types.SimpleNamespace(store=self.store,
                                                     scheduler=types.SimpleNamespace(poll_now=self.asked.append)))

    async def poll_all(self) -> None:
        await asyncio.gather(*(r.run_once() for r in self.runners.values()))
        await asyncio.gather(*(r._letting_go for r in self.runners.values() if r._letting_go is not None))

    async def close(self) -> None:
        await self.coord.stop()
        for r in self.runners.values():
            await r.source.close()


def _service(sim, name: str):
    return sim.sim.devices[name]


def test_a_redfish_cdu_is_a_shared_safety_device_and_trays_are_not(sim, tmp_path):
    loaded = _loaded(sim, tmp_path, "node01")
    shared = shared_devices(loaded.config.inventory)
    assert shared.jobs["redfish/rfcdu1"] == "rfcdu1"
    assert "redfish/rfcdu1" in shared.safety  # its own leak detectors: read by every agent while degraded
    assert not any(j.startswith("redfish/bmc-node") for j in shared.jobs)  # a switch tray's BMC is (issue 34)
    assert leader_jobs(loaded.config) == {"redfish/bmc-node02"}
    # Static (no coordination): only the configured leader (node01) has the other trays' sources at all; the
    # switch tray's BMC is a shared device like the CDU (issue 34).
    assert {s.source.device for s in build_sources(_loaded(sim, tmp_path, "node02"))
            if s.source.name == "redfish"} == {"bmc-node02", "rfcdu1", "bmc-switch01"}


def test_a_source_that_is_not_ours_lets_go_of_the_service_and_takes_it_up_again(sim, tmp_path):
    """gate None (another agent polls it): the event stream closes and the session logs out; True: both again."""
    loaded = _loaded(sim, tmp_path, "node01")
    cdu = _service(sim, "rfcdu1")

    async def run() -> list[tuple[int, int]]:
        store = SnapshotStore()
        src = next(s for s in build_sources(loaded) if s.source.device == "rfcdu1")
        runner = SourceRunner(src.source, src.settings, store, 2.0)
        seen = []
        try:
            runner.gate = lambda: True
            await runner.run_once()
            await await_for(lambda: cdu.describe()["sse_streams"] == 1, 20, what="the poller's event stream open")
            seen.append((cdu.describe()["sse_streams"], cdu.describe()["sessions"]))
            runner.gate = lambda: None
            await runner.run_once()
            await await_for(lambda: cdu.describe()["sse_streams"] == 0 and cdu.describe()["sessions"] == 0, 20,
                            what="stream closed and session logged out")
            seen.append((cdu.describe()["sse_streams"], cdu.describe()["sessions"]))
            polls = runner.polls
            await runner.run_once()  # still not ours: no poll, nothing opened again
            assert runner.polls == polls
            runner.gate = lambda: True
            await runner.run_once()
            await await_for(lambda: cdu.describe()["sse_streams"] == 1, 20, what="the stream open again")
            seen.append((cdu.describe()["sse_streams"], cdu.describe()["sessions"]))
            assert store.snapshot().source_up("redfish", "rfcdu1")
        finally:
            await src.source.close()
        return seen

    assert asyncio.run(run()) == [(1, 1), (0, 0), (1, 1)]


def test_the_redfish_cdu_has_one_poller_and_the_other_trays_follow_the_elected_leader(sim, etcd, tmp_path):
    async def run() -> None:
        agents = [Agent(_loaded(sim, tmp_path, n, etcd, prefix="/rf-roles", pollers_per_device=1)) for n in NODES]
        closed: set[str] = set()
        try:
            for a in agents:
                await a.start()
            await await_for(lambda: all(a.coord.up() for a in agents), 30, what="both coordinating")
            await await_for(lambda: sum(a.coord.is_leader() for a in agents) == 1, 30, what="one leader")
            await await_for(lambda: sum(a.coord.polls("rfcdu1") for a in agents) == 1, 30, what="one CDU poller")
            leader = next(a for a in agents if a.coord.is_leader())
            other = next(a for a in agents if a is not leader)
            # A tray BMC is its own node's: never gated, on the leader or not.
            for a in agents:
                assert a.runners[f"redfish/bmc-{a.node}"].gate is None
            for a in agents:
                await a.poll_all()
            poller = next(a for a in agents if a.coord.polls("rfcdu1"))
            assert _service(sim, "rfcdu1").clients(60) == 1, "the Redfish CDU is read by its one poller only"
            assert _service(sim, f"bmc-{leader.node}").clients(60) == 1  # its own agent (the leader)
            assert _service(sim, f"bmc-{other.node}").clients(60) == 2  # its own agent and the leader's watch
            for a in agents:
                hidden = a.coord.hidden()
                assert (("redfish", "rfcdu1") in hidden) is (a is not poller)
                assert (("redfish", f"bmc-{leader.node}") in hidden) is (a is other)  # idle: not the leader
                assert a.store.snapshot().source_up("redfish", f"bmc-{a.node}")
            assert leader.store.snapshot().source_up("redfish", f"bmc-{other.node}")
            # The agent that does not poll the CDU has its polls from etcd, and its leak watch names the CDU's own
            # detectors (learnt from those polls), not a service-wide stand-in it could never clear.
            reader = next(a for a in agents if a is not poller)
            await await_for(lambda: reader.store.snapshot().source_up("redfish", "rfcdu1"), 20,
                            what="the poller's facts at the other agent")
            watch = LeakWatchSource(reader.store, [r.source for r in reader.runners.values()], reader.coord.idle)
            watched = {(r.label("zone"), r.label("sensor")) for r in (await watch.poll()).readings
                       if r.label("zone") == "rfcdu1"}
            detectors = set(poller.runners["redfish/rfcdu1"].source.leak_sensors())
            assert detectors and all("/" in sensor for _, sensor in detectors), detectors
            assert watched == detectors

            # The leader's agent stops: the other is elected and reads the first one's tray at once.
            await leader.close()
            closed.add(leader.node)
            await await_for(lambda: other.coord.is_leader(), 30, what="the other agent elected")
            await await_for(lambda: f"redfish/bmc-{leader.node}" in other.asked, 10,
                            what="the old leader's tray polled at once by the new leader")
            assert other.runners[f"redfish/bmc-{leader.node}"].gate() is True
            assert other.coord.idle() == frozenset()
            await other.runners[f"redfish/bmc-{leader.node}"].run_once()
            assert other.store.snapshot().source_up("redfish", f"bmc-{leader.node}")
        finally:
            for a in agents:
                if a.node not in closed:
                    await a.close()

    asyncio.run(run())
