"""Which pollers' facts an agent takes into its store, and a standby's poll phase.

A leak controller has two pollers; the first publishes every poll, the second (the hot standby) polls half an
interval out of phase and publishes its wet polls too, so the rack hears of a leak from whichever reads it
first. These tests drive the receiving side (a real SnapshotStore) and the timer move (a real apscheduler)
directly, with explicit poll times: nothing waits on a clock.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest

from agent.config import SourceSettings
from agent.coordination import facts
from agent.coordination.exchange import FactExchange
from agent.coordination.facts import Fact, encode, is_wet
from agent.runtime import SourceRunner, SourceScheduler
from agent.snapshot import SnapshotStore
from exporters.cooling.modbus import ModbusSource
from exporters.cooling.modbus_metrics import LEAK_DETECTED
from exporters.model import Quality, counter, gauge, make_reading

JOB = "leak/leak1"
SAFETY = frozenset({JOB})


class _Runner:
    """What FactExchange reads of a runner: its interval, and its source (the families a fact may hold)."""

    settings = SourceSettings(interval=0.5)
    source = ModbusSource("leak", "leak1", "rle-ld2100", channels={1: "zone-c"})  # never polled here


def _exchange(store: SnapshotStore, safety=SAFETY) -> FactExchange:
    fx = FactExchange("node03", {JOB: "leak1", "pdu/pdu-a": "pdu-a"}, 3.0, time.time, safety)
    fx.store = store
    fx.runners = {JOB: _Runner()}
    store.register("leak", "leak1", 0.5, 3.0)
    return fx


def _fact(poller: str, wet: bool, started: float, source="leak", device="leak1") -> Fact:
    r = make_reading(LEAK_DETECTED, 1.0 if wet else 0.0, {"zone": "zone-c", "sensor": "zone-1"}, Quality.OK, started)
    return Fact(poller, source, device, True, [r], 0.02, at=started + 0.02)


def _held_value(store: SnapshotStore) -> float | None:
    return store.snapshot().value(LEAK_DETECTED.name, zone="zone-c", sensor="zone-1")


def _not_polling(device: str) -> bool:
    return False


def test_a_standbys_wet_poll_is_taken_although_the_first_poller_reads_fine():
    store = SnapshotStore()
    fx = _exchange(store)
    t = time.time()
    assert fx.ingest(JOB, "node01", encode(_fact("node01", False, t)), _not_polling) is None
    assert _held_value(store) == 0.0
    fx.ingest(JOB, "node02", encode(_fact("node02", False, t + 0.25)), _not_polling)
    assert fx.held[JOB][1] == "node01", "a dry standby poll is not a second copy worth taking"
    fx.ingest(JOB, "node02", encode(_fact("node02", True, t + 0.5)), _not_polling)
    assert _held_value(store) == 1.0 and fx.held[JOB][1] == "node02"


def test_without_the_safety_rule_the_first_poller_alone_is_taken():
    store = SnapshotStore()
    fx = _exchange(store, safety=frozenset())
    t = time.time()
    fx.ingest(JOB, "node01", encode(_fact("node01", False, t)), _not_polling)
    fx.ingest(JOB, "node02", encode(_fact("node02", True, t + 0.25)), _not_polling)
    assert _held_value(store) == 0.0


def test_an_older_poll_from_the_other_poller_does_not_replace_a_newer_one():
    """The first poller's dry poll started before the standby's wet one but arrived after it: dropped."""
    store = SnapshotStore()
    fx = _exchange(store)
    t = time.time()
    fx.ingest(JOB, "node02", encode(_fact("node02", True, t)), _not_polling)
    fx.ingest(JOB, "node01", encode(_fact("node01", False, t - 0.1)), _not_polling)
    assert _held_value(store) == 1.0
    fx.ingest(JOB, "node01", encode(_fact("node01", True, t + 0.5)), _not_polling)  # its next poll: newer
    assert fx.held[JOB][1] == "node01" and abs(fx.held[JOB][0] - (t + 0.5)) < 1e-6


def test_wet_and_poll_start_read_from_the_fact():
    assert facts.LEAK_DETECTED == LEAK_DETECTED.name
    t = time.time()
    assert is_wet(_fact("n", True, t)) and not is_wet(_fact("n", False, t))
    faulted = _fact("n", True, t)
    faulted.readings = [make_reading(LEAK_DETECTED, 1.0, {"zone": "z", "sensor": "s"}, Quality.SENSOR_FAULT, t)]
    assert not is_wet(faulted), "a reading that is not ok is a sensor fault, never a leak"
    fact = _exchange(SnapshotStore()).check(JOB, "n", encode(_fact("n", False, t)))
    assert abs(fact.at - fact.duration - t) < 1e-6


class _Idle:
    def __init__(self, name: str = "leak", device: str = "leak1"):
        self.name, self.device = name, device

    async def poll(self):
        raise AssertionError("not polled in this test")


def _idle_scheduler(*job_ids: str) -> SourceScheduler:
    sched = SourceScheduler(SnapshotStore())
    for job_id in job_ids:
        sched._add(SourceRunner(_Idle(*job_id.split("/")), SourceSettings(interval=0.5), sched.store, 3.0))
    return sched


def _phase(job, anchor: float, interval: float = 0.5) -> float:
    """How far the job's next fire is past `anchor`, modulo the interval, folded to [0, interval/2]."""
    off = (job.next_run_time.timestamp() - anchor) % interval
    return min(off, interval - off)


def test_align_moves_a_timer_to_the_phase_asked_and_leaves_one_already_there():
    async def run() -> None:
        sched = _idle_scheduler(JOB, "cdu/stays")  # a source of the same interval that is not moved
        sched.scheduler.start(paused=True)  # the timer is read and moved, never fired
        try:
            shared = sched.timer(JOB)  # its interval's shared timer
            anchor = time.time() + 100.0  # a first poller's poll start, far from this timer's phase
            shared.modify(next_run_time=dt.datetime.fromtimestamp(anchor + 0.01, dt.timezone.utc))
            assert sched.align(JOB, anchor, 0.25)
            own = sched.timer(JOB)
            assert own.id == JOB and own.id != shared.id, "moved onto a timer of its own"
            assert sched.scheduler.get_job(shared.id).next_run_time.timestamp() == pytest.approx(anchor + 0.01), \
                "the shared timer (the other sources of that interval) did not move"
            moved = own.next_run_time.timestamp()
            assert abs((moved - anchor - 0.25) % 0.5) < 1e-3 or abs((moved - anchor - 0.25) % 0.5 - 0.5) < 1e-3
            assert moved >= time.time() - 0.01
            assert not sched.align(JOB, anchor, 0.25), "already half an interval out: left alone"
            assert not sched.align("leak/other", anchor, 0.25)
            assert sched.timer("cdu/stays").id == shared.id
        finally:
            sched.scheduler.shutdown(wait=False)

    asyncio.run(run())


def test_sources_moved_to_one_phase_share_one_timer_and_an_empty_timer_is_removed():
    """A standby's two leak inputs, each moved half an interval after its first poller (who polls both on one
    timer), fire on one timer of their own, not two: each timer is a wake-up of the agent twice a second."""
    async def run() -> None:
        sched = _idle_scheduler("leak/leak1", "leak/cdu1", "cdu/stays")
        sched.scheduler.start(paused=True)
        try:
            shared = sched.timer("leak/leak1")
            anchor = time.time() + 100.0
            shared.modify(next_run_time=dt.datetime.fromtimestamp(anchor + 0.01, dt.timezone.utc))
            assert sched.align("leak/leak1", anchor, 0.25)
            assert sched.align("leak/cdu1", anchor + 0.02, 0.25), "within a tenth of an interval of the same phase"
            moved = sched.timer("leak/leak1")
            assert sched.timer("leak/cdu1").id == moved.id != shared.id
            assert _phase(moved, anchor + 0.25) < 1e-3
            assert sorted(job.id for job in sched.scheduler.get_jobs()) == sorted([shared.id, moved.id])
            assert sched.timer("cdu/stays").id == shared.id

            # leak1's first poller changes phase: leak1 leaves the shared moved timer for one at its new phase
            assert sched.align("leak/leak1", anchor + 0.1, 0.25)
            alone = sched.timer("leak/leak1")
            assert alone.id not in (moved.id, shared.id) and _phase(alone, anchor + 0.35) < 1e-3
            assert sched.timer("leak/cdu1").id == moved.id and _phase(moved, anchor + 0.25) < 1e-3, \
                "the other source's timer did not move with it"
            # and cdu1 follows it there: the timer cdu1 leaves starts nothing any more and is gone
            assert sched.align("leak/cdu1", anchor + 0.1, 0.25)
            assert sched.timer("leak/cdu1").id == alone.id
            assert sorted(job.id for job in sched.scheduler.get_jobs()) == sorted([shared.id, alone.id])
        finally:
            sched.scheduler.shutdown(wait=False)

    asyncio.run(run())


def _pdu_fact(watts: float, requests: float, at: float) -> Fact:
    power = make_reading(_PDU_POWER, watts, {"pdu": "pdu-a"}, Quality.OK, at)
    polled = make_reading(_PDU_REQUESTS, requests, {"pdu": "pdu-a"}, Quality.OK, at)
    return Fact("node01", "pdu", "pdu-a", True, [power, polled], 0.01, at=at)


_PDU_POWER = gauge("supernode_pdu_test_power_watts", "a gauge some detector could read", ("pdu",))
_PDU_REQUESTS = counter("supernode_pdu_test_requests_total", "a client's own counter: changes every poll", ("pdu",))


def test_an_unchanged_poll_is_withheld_until_the_heartbeat_and_a_change_or_a_wet_poll_goes_out_at_once():
    """Issue 38: the poller sends a poll when what a detector reads changed, every wet leak poll (the second
    wet poll of a confirmation reads the same as the first, and must reach every agent too), and otherwise one
    every heartbeat. The clock is driven by hand."""
    now = [100.0]
    fx = FactExchange("node01", {JOB: "leak1", "pdu/pdu-a": "pdu-a"}, 2.0, time.time, SAFETY, heartbeat=2.0,
                      monotonic=lambda: now[0])
    assert fx.due(JOB, _fact("node01", False, 1.0))  # the first poll always goes out
    now[0] += 0.5
    assert not fx.due(JOB, _fact("node01", False, 1.5))  # the same reading, later: withheld
    now[0] += 0.5
    assert fx.due(JOB, _fact("node01", True, 2.0))  # wet: at once
    now[0] += 0.01
    assert fx.due(JOB, _fact("node01", True, 2.01))  # the confirmation's second wet poll too
    now[0] += 0.5
    assert fx.due(JOB, _fact("node01", False, 2.5))  # dry again: a change
    now[0] += 1.9
    assert not fx.due(JOB, _fact("node01", False, 4.4))
    now[0] += 0.1
    assert fx.due(JOB, _fact("node01", False, 4.5))  # 2 s after the last one out: the heartbeat
    assert fx.withheld == 2
    # A counter no detector reads changes with every poll and sends nothing; a gauge's change does.
    assert fx.due("pdu/pdu-a", _pdu_fact(1000.0, 1.0, 1.0))
    now[0] += 0.5
    assert not fx.due("pdu/pdu-a", _pdu_fact(1000.0, 2.0, 1.5))
    assert fx.due("pdu/pdu-a", _pdu_fact(1100.0, 3.0, 2.0))
    # A failed poll is news as well.
    assert fx.due("pdu/pdu-a", Fact("node01", "pdu", "pdu-a", False, [], 0.5, "poll", "timeout", at=2.5))


def test_a_receiver_counts_a_fed_entry_stale_in_heartbeats_not_in_its_poll_interval():
    """Facts of a 0.5 s leak poll arrive a heartbeat (2 s) apart while nothing changes: the receiver's entry must
    stay fresh between them (two heartbeats), or the leak watch would call the zone unknown in every gap."""
    clock = [1000.0]
    store = SnapshotStore(clock=lambda: clock[0])
    fx = FactExchange("node03", {JOB: "leak1"}, 2.0, lambda: clock[0], SAFETY, heartbeat=2.0)
    fx.store, fx.runners = store, {JOB: _Runner()}
    store.register("leak", "leak1", 0.5, 2.0)  # its own runner's interval: stale after 1 s
    assert fx.ingest(JOB, "node01", encode(_fact("node01", False, clock[0] - 0.02)), _not_polling) is None
    clock[0] += 3.5  # past 1 s, within two heartbeats
    assert _held_value(store) == 0.0
    clock[0] += 1.0
    assert _held_value(store) is None  # two heartbeats missing: stale, the zone unknown


def test_a_poll_vouched_fresh_sends_the_heartbeat_half_a_tick_early_and_never_before_a_first_fact():
    """A Redfish BMC whose event stream is up ticks every 2 s (its interval, the heartbeat too) and is vouched fresh
    at each tick without a publish: its heartbeat must go out at the tick that falls a millisecond short of 2 s, or
    every other beat is missed and its facts arrive 4 s apart, at the receivers' edge of stale (2 heartbeats)."""
    now = [100.0]
    job = "redfish/rfcdu1"
    fx = FactExchange("node01", {job: "rfcdu1"}, 2.0, time.time, heartbeat=2.0, monotonic=lambda: now[0])
    runner = _Runner()
    runner.settings = SourceSettings(interval=2.0)
    fx.runners = {job: runner}
    assert not fx.heartbeat_due(job)  # nothing sent yet: the first poll's publish goes out, not a beat
    fact = Fact("node01", "redfish", "rfcdu1", True, [], 0.01, at=100.0)
    assert fx.due(job, fact)
    now[0] += 0.9
    assert not fx.heartbeat_due(job)
    now[0] += 1.099  # 1.999 s after the last fact out
    assert fx.heartbeat_due(job) and fx.due(job, fact, beat=True)
    assert not fx.heartbeat_due(job)  # sent: the next one a heartbeat later
    fx.heartbeat = 0.0
    assert not fx.heartbeat_due(job)  # every poll goes out anyway
