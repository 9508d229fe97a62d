"""The GPU exporter against the NVML twin, which talks to a real simulator HTTP endpoint on 127.0.0.1."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pynvml
import pytest

from sim.nvml_twin import NvmlTwin
from sim.rack import RackModel
from exporters.gpu import nvml_metrics as M
from exporters.model import PollResult, Quality, SourceError
from exporters.gpu.nvml import NvmlSource
from exporters.gpu.nvml_control import get_power_limit, set_power_limit
from tests.helpers import await_for, free_port
from tests.nvml_sim import serve

NODE = "node01"
GPUS = 4
LINKS = 4


@pytest.fixture
def model() -> RackModel:
    m = RackModel(nodes=2, gpus_per_node=GPUS, nvlinks=LINKS, seed=3)
    m.step(2.0)
    return m


@pytest.fixture
def sim(model: RackModel):
    yield from serve(model)


def source(sim: Any, node: str = NODE, xid: bool = False, timeout: float = 5.0, lib: Any = None) -> NvmlSource:
    return NvmlSource(lib or NvmlTwin(sim.url, node), GPUS, LINKS, call_timeout=timeout, xid_events=xid,
                      gpu_timeout=timeout * 0.8)  # wide: only an injected hang trips it on a loaded machine


def run(coro_fn):
    return asyncio.run(coro_fn())


def values(result: PollResult, spec, **labels: str) -> dict[tuple, float]:
    """OK readings of one family matching `labels`, keyed by their full label set."""
    return {tuple(sorted(r.labels.items())): r.value for r in result.readings
            if r.spec is spec and r.ok and all(r.labels.get(k) == v for k, v in labels.items())}


def one(result: PollResult, spec, **labels: str) -> float:
    found = values(result, spec, **labels)
    assert len(found) == 1, f"{spec.name} {labels}: {found}"
    return next(iter(found.values()))


async def poll_close(src: NvmlSource, n: int = 1) -> list[PollResult]:
    try:
        return [await src.poll() for _ in range(n)]
    finally:
        await src.close()


def test_normal_readings_follow_the_model(sim, model):
    (res,) = run(lambda: poll_close(source(sim)))
    g = model.gpu(NODE, 2)
    uuid = g.uuid
    assert sorted(values(res, M.GPU_UP).values()) == [1.0] * GPUS
    assert one(res, M.POWER, gpu="2") == pytest.approx(g.power_w, abs=0.002)
    assert one(res, M.ENERGY, gpu="2") == pytest.approx(g.energy_mj / 1000, abs=0.002)
    assert one(res, M.TEMPERATURE, gpu="2", sensor="gpu") == round(g.temp_c)
    assert one(res, M.TEMPERATURE, gpu="2", sensor="memory") == round(g.mem_temp_c)
    assert one(res, M.POWER_LIMIT, gpu="2", limit="min") == g.min_limit_mw / 1000
    assert one(res, M.POWER_LIMIT, gpu="2", limit="current") == g.power_limit_mw / 1000
    assert one(res, M.THRESHOLD, gpu="2", threshold="slowdown") == g.slowdown_c
    assert one(res, M.CLOCK, gpu="2", clock="memory") == g.mem_clock_mhz * 1e6
    assert one(res, M.MEMORY_TOTAL, gpu="2") == g.memory_total
    assert one(res, M.NVLINK_TX, gpu="2", link="3") == int(g.nvlink_tx_kib[3]) * 1024
    assert one(res, M.NVLINK_UP, gpu="2", link="0") == 1.0
    assert one(res, M.RECOVERY, gpu="2", action="none") == 1.0
    info = [r for r in res.readings if r.spec is M.GPU_INFO and r.labels["gpu"] == "2"]
    assert info[0].labels["uuid"] == uuid and info[0].labels["pci_bus_id"] == g.pci_bus_id
    assert info[0].labels["driver"] and info[0].labels["cuda"] == "12.8"
    # every NVLink of every GPU: 5 error types (3 batched fields + 2 per-link counters)
    assert len(values(res, M.NVLINK_ERRORS)) == GPUS * LINKS * 5
    assert res.partial_errors == {}


def test_counters_move_with_faults(sim, model):
    async def scenario():
        src = source(sim)
        try:
            first = await src.poll()
            with model.lock:
                g = model.gpu(NODE, 1)
                g.nvlink_error_rate[2] = 50.0
                g.thermal_extra_c = 40.0
                g.ecc_corrected = 7
            model.step(5.0)
            return first, await src.poll()
        finally:
            await src.close()

    first, second = run(scenario)
    assert one(second, M.NVLINK_ERRORS, gpu="1", link="2", type="crc_flit") >= 250
    assert one(first, M.NVLINK_ERRORS, gpu="1", link="2", type="crc_flit") == 0
    assert one(second, M.NVLINK_ERRORS, gpu="1", link="1", type="crc_flit") == 0
    assert one(second, M.CLOCK_EVENT, gpu="1", reason="hw_thermal") == 1.0
    assert one(second, M.CLOCK_EVENT, gpu="0", reason="hw_thermal") == 0.0
    assert one(second, M.ECC, gpu="1", type="corrected", scope="volatile") == 7


class CountingTwin(NvmlTwin):
    """Records the calls that matter for the NotSupported-once rule."""

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.energy_calls: list[int] = []
        self.field_batches: list[list] = []

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.energy_calls.append(h.index)
        return super().nvmlDeviceGetTotalEnergyConsumption(h)

    def nvmlDeviceGetFieldValues(self, h, ids):
        self.field_batches.append((h.index, list(ids)))
        return super().nvmlDeviceGetFieldValues(h, ids)


def test_not_supported_is_reported_once_and_not_asked_again(sim, model):
    model.gpu(NODE, 1).unsupported = {"nvmlDeviceGetTotalEnergyConsumption", "NVML_FI_DEV_MEMORY_TEMP"}
    twin = CountingTwin(sim.url, NODE)
    first, second, third = run(lambda: poll_close(source(sim, lib=twin), 3))
    unsup = [r for r in first.readings if r.quality is Quality.UNSUPPORTED and r.labels["gpu"] == "1"]
    assert {(r.spec.name, r.labels.get("sensor")) for r in unsup} == {
        (M.ENERGY.name, None), (M.TEMPERATURE.name, "memory"),
        # NVLink5 fields on an NVLink4 GPU, and C2C counters on a GPU without C2C, also answered once
        (M.NVLINK_ERRORS.name, None), (M.NVLINK_BER.name, None), (M.C2C_ERRORS.name, None),
        # and the NVLink fabric registration the twin's H100 has none of
        (M.FABRIC_STATE.name, None)}
    assert all(math.isnan(r.value) for r in unsup)
    for later in (second, third):
        assert not [r for r in later.readings if r.quality is Quality.UNSUPPORTED]
        assert not values(later, M.ENERGY, gpu="1")
        assert not values(later, M.TEMPERATURE, gpu="1", sensor="memory")
        assert values(later, M.ENERGY, gpu="0") and values(later, M.TEMPERATURE, gpu="0", sensor="memory")
    assert twin.energy_calls.count(1) == 1 and twin.energy_calls.count(0) == 3
    batches_1 = [ids for idx, ids in twin.field_batches if idx == 1]
    assert pynvml.NVML_FI_DEV_MEMORY_TEMP in batches_1[0]
    assert all(pynvml.NVML_FI_DEV_MEMORY_TEMP not in ids for ids in batches_1[1:])
    # GPU 0 asks it on every cycle (in the batch of fields read every cycle; the error counters' batch is apart)
    assert sum(pynvml.NVML_FI_DEV_MEMORY_TEMP in ids for idx, ids in twin.field_batches if idx == 0) == 3
    assert second.partial_errors == {} and third.partial_errors == {}


def test_gpu_lost_gives_up_zero_and_drops_its_series(sim, model):
    async def scenario():
        src = source(sim)
        try:
            before = await src.poll()
            model.gpu(NODE, 2).lost = True
            during = await src.poll()
            model.gpu(NODE, 2).lost = False
            return before, during, await src.poll()
        finally:
            await src.close()

    before, during, after = run(scenario)
    uuid = model.gpu(NODE, 2).uuid
    assert one(before, M.GPU_UP, gpu="2") == 1.0
    assert [(r.spec.name, dict(r.labels), r.value) for r in during.readings if r.labels.get("gpu") == "2"] == [
        (M.GPU_UP.name, {"gpu": "2", "uuid": uuid}, 0.0)]
    assert one(during, M.GPU_UP, gpu="1") == 1.0 and values(during, M.POWER, gpu="1")
    assert one(after, M.GPU_UP, gpu="2") == 1.0 and values(after, M.POWER, gpu="2")


def test_error_counters_are_read_every_counters_every_cycles_and_at_once_after_a_missed_cycle(sim, model):
    """Power and link state every cycle; error counters (NVLink fields and calls, ECC) every third: in between
    a cycle gives the last read's readings again, timestamps included, and a GPU back from lost reads them
    at once."""
    twin = CountingTwin(sim.url, NODE)

    async def scenario():
        src = NvmlSource(twin, GPUS, LINKS, call_timeout=5.0, xid_events=False, gpu_timeout=4.0, counters_every=3)
        try:
            out = [await src.poll()]
            with model.lock:
                g = model.gpu(NODE, 1)
                g.nvlink_error_rate[2] = 50.0
                g.ecc_corrected = 7
            model.step(5.0)
            out += [await src.poll(), await src.poll(), await src.poll()]  # cycles 2, 3: given again; 4: read
            model.gpu(NODE, 1).lost = True
            out.append(await src.poll())  # cycle 5: lost
            model.gpu(NODE, 1).lost = False
            model.step(5.0)
            out.append(await src.poll())  # cycle 6: back, and read at once (not at cycle 7)
            return out
        finally:
            await src.close()

    first, second, third, fourth, lost, back = run(scenario)

    def counters(res: PollResult) -> tuple[float, float, float]:
        (r,) = [r for r in res.readings if r.spec is M.NVLINK_ERRORS and r.ok and r.labels["gpu"] == "1"
                and r.labels.get("link") == "2" and r.labels.get("type") == "crc_flit"]
        return r.value, r.timestamp, one(res, M.ECC, gpu="1", type="corrected", scope="volatile")

    assert counters(first)[0] == 0 and counters(first)[2] == 0
    assert counters(second) == counters(first) and counters(third) == counters(first)  # the cycle-1 read again
    power = [r for r in second.readings if r.spec is M.POWER and r.labels["gpu"] == "1"]
    assert power and power[0].timestamp > counters(first)[1]  # read in its own cycle, not given again
    value, ts, ecc = counters(fourth)
    assert value >= 250 and ecc == 7 and ts > counters(first)[1]
    assert not [r for r in lost.readings if r.labels.get("gpu") == "1" and r.spec is not M.GPU_UP]
    assert counters(back)[0] > value and counters(back)[1] > ts
    # one field batch for the error counters per read (cycles 1, 4, 6), one for the rest every cycle but the lost one
    batches_1 = [ids for idx, ids in twin.field_batches if idx == 1]
    crc = pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC
    assert [any(isinstance(i, tuple) and i[0] == crc for i in ids) for ids in batches_1] == [
        False, True, False, False, False, True, False, True]
    # nothing missing between reads, and what answered NotSupported (NVLink5 fields here) is said once only
    assert [r for r in first.readings if r.quality is Quality.UNSUPPORTED]
    assert not [r for r in second.readings + third.readings if r.quality is Quality.UNSUPPORTED]
    assert len(second.readings) == len(third.readings) == len([r for r in first.readings if r.ok])


def test_gpu_missing_against_inventory(sim, model):
    model.gpu(NODE, 1).missing = True  # fallen off the bus: NVML enumerates 3 GPUs, renumbered
    (res,) = run(lambda: poll_close(source(sim)))
    up = values(res, M.GPU_UP)
    assert up == {(("gpu", "0"), ("uuid", model.gpu(NODE, 0).uuid)): 1.0,
                  (("gpu", "1"), ("uuid", model.gpu(NODE, 2).uuid)): 1.0,
                  (("gpu", "2"), ("uuid", model.gpu(NODE, 3).uuid)): 1.0,
                  (("gpu", "3"), ("uuid", "")): 0.0}
    assert not [r for r in res.readings if r.labels.get("gpu") == "3" and r.spec is not M.GPU_UP]


def test_a_gpu_count_below_the_inventory_is_gpu_lost_saying_missing_with_the_count(sim, model):
    """Issue 33: the GPU count below the inventory is a cause of its own: the index NVML no longer enumerates
    fires gpu_lost with why "missing" and how many GPUs NVML names against the inventory's count."""
    from agent.remediation.detectors import Context, Detectors
    from agent.remediation.settings import DetectorSettings
    from agent.snapshot import Snapshot

    model.gpu(NODE, 1).missing = True
    (res,) = run(lambda: poll_close(source(sim)))
    d = Detectors(DetectorSettings(), Context(node=NODE, rack="r01", expected_gpus=GPUS))
    now = max(r.timestamp for r in res.readings)
    events = [e for e in d.evaluate(Snapshot(now, tuple(res.readings), ())) if e.detector == "gpu_lost"]
    assert [(e.kind, e.targets, e.detail) for e in events] == [
        ("fire", {"node": NODE, "gpu": "3"}, {"why": "missing", "seen": GPUS - 1, "expected": GPUS})]


def _ticking():
    """A task counting event-loop turns: proof the loop ran while a driver call was blocked."""
    ticks = [0]

    async def ticker():
        while True:
            ticks[0] += 1
            await asyncio.sleep(0.01)

    return ticks, asyncio.create_task(ticker())


def _gpu_series(res: PollResult, gpu: str) -> set[str]:
    return {r.spec.name for r in res.readings if r.labels.get("gpu") == gpu}


def test_a_hung_gpu_is_one_gpu_the_others_keep_reporting(sim, model):
    async def scenario():
        src = NvmlSource(NvmlTwin(sim.url, NODE), GPUS, LINKS, call_timeout=5.0, xid_events=False, gpu_timeout=1.0)
        ticks, t = _ticking()
        try:
            await src.poll()
            model.gpu(NODE, 2).hang_seconds = 60.0
            before = ticks[0]
            during = [await src.poll() for _ in range(3)]  # no SourceError: the cycle goes on without GPU 2
            loop_ran = ticks[0] > before
            threads = src._lanes.threads_started
            again = await src.poll()
            assert src._lanes.threads_started == threads  # a still-hung GPU piles no threads up
            model.gpu(NODE, 2).hang_seconds = 0.0

            async def answered():
                res = await src.poll()
                return res if values(res, M.GPU_HUNG, gpu="2") == {
                    (("gpu", "2"), ("uuid", model.gpu(NODE, 2).uuid)): 0.0} else None

            back = await await_for(answered, timeout=15, interval=0.1, what="GPU 2 probed and read again")
            return during + [again], loop_ran, back
        finally:
            t.cancel()
            await src.close()

    during, loop_ran, back = run(scenario)
    uuid2 = model.gpu(NODE, 2).uuid
    assert loop_ran
    for res in during:
        assert one(res, M.GPU_HUNG, gpu="2") == 1.0 and one(res, M.GPU_UP, gpu="2") == 0.0
        assert _gpu_series(res, "2") == {M.GPU_UP.name, M.GPU_HUNG.name}  # nothing old presented as fresh
        assert {r.labels["uuid"] for r in res.readings if r.labels.get("gpu") == "2"} == {uuid2}
        for gpu in ("0", "1", "3"):
            assert one(res, M.GPU_UP, gpu=gpu) == 1.0 and one(res, M.GPU_HUNG, gpu=gpu) == 0.0
            assert one(res, M.POWER, gpu=gpu) == pytest.approx(model.gpu(NODE, int(gpu)).power_w, abs=1.0)
            assert len(values(res, M.NVLINK_ERRORS, gpu=gpu)) == LINKS * 5
    assert one(back, M.GPU_UP, gpu="2") == 1.0 and values(back, M.POWER, gpu="2")


def test_a_hung_driver_marks_the_source_down_without_stalling_others(sim, model):
    async def scenario():
        hung = source(sim, timeout=0.6)
        other = source(sim, node="node02", timeout=2.0)
        ticks, t = _ticking()
        try:
            await hung.poll()
            model.nodes[NODE].nvml_hang_seconds = 60.0
            hung._lib._state = None  # the fault is set behind the twin's cache
            before = ticks[0]
            with pytest.raises(SourceError) as err:
                await hung.poll()
            loop_ran = ticks[0] > before
            assert err.value.kind == "timeout"
            ok = await other.poll()  # another node's driver answers meanwhile
            with pytest.raises(SourceError) as again:
                await hung.poll()  # refused at once: the hung call has not returned
            assert again.value.kind == "timeout" and "still hung" in str(again.value)
            model.nodes[NODE].nvml_hang_seconds = 0.0

            async def recovered():
                try:
                    return await hung.poll()
                except SourceError:
                    return None

            back = await await_for(recovered, timeout=15, interval=0.1, what="nvml source to recover")
            return loop_ran, ok, back
        finally:
            t.cancel()
            await hung.close()
            await other.close()

    loop_ran, ok, back = run(scenario)
    assert loop_ran  # the event loop kept running while the driver thread was blocked
    assert sorted(values(ok, M.GPU_UP).values()) == [1.0] * GPUS
    assert sorted(values(back, M.GPU_UP).values()) == [1.0] * GPUS
    assert sorted(values(back, M.GPU_HUNG).values()) == [0.0] * GPUS


def test_xid_events_become_counters_and_last_xid(sim, model):
    """Each XID's counter carries the catalogue's immediate action: the config's override for one entry wins, a
    code the catalogue lacks reads `unknown`."""
    async def scenario():
        src = NvmlSource(NvmlTwin(sim.url, NODE), GPUS, LINKS, call_timeout=5.0, xid_events=True,
                         xid_overrides={48: "RESET_GPU"})
        try:
            await src.poll()
            assert await asyncio.get_running_loop().run_in_executor(None, src.events_ready.wait, 10)
            model.raise_xid(NODE, 1, 79)
            model.raise_xid(NODE, 1, 79)
            model.raise_xid(NODE, 1, 48)
            model.raise_xid(NODE, 1, 250)  # no such XID in the catalogue
            model.raise_xid("node02", 1, 13)  # another node's GPU: not ours
            uuid = model.gpu(NODE, 1).uuid

            async def seen():
                res = await src.poll()
                return res if values(res, M.XID, gpu="1") == {
                    (("action", "RESET_GPU"), ("gpu", "1"), ("uuid", uuid), ("xid", "48")): 1.0,
                    (("action", "RESTART_BM"), ("gpu", "1"), ("uuid", uuid), ("xid", "79")): 2.0,
                    (("action", "unknown"), ("gpu", "1"), ("uuid", uuid), ("xid", "250")): 1.0} else None

            return await await_for(seen, timeout=10, interval=0.05, what="xid counters")
        finally:
            await asyncio.wait_for(src.close(), 10)  # close wakes the event thread: it must not hang
            assert not src._events.is_alive()

    res = run(scenario)
    assert one(res, M.LAST_XID, gpu="1") == 250
    assert one(res, M.LAST_XID, gpu="0") == 0
    assert not values(res, M.XID, gpu="0")


def test_xid_of_a_hung_gpu_is_published_on_its_own_path_without_a_poll(sim, model):
    """XIDs reach the store through the event stream: no poll cycle (hung or not) stands in between."""
    published: list[list] = []

    async def scenario():
        src = NvmlSource(NvmlTwin(sim.url, NODE), GPUS, LINKS, call_timeout=5.0, xid_events=True, gpu_timeout=1.0)
        src.event_stream.attach(published.append, every=60.0)
        try:
            first = await src.poll()
            assert await asyncio.get_running_loop().run_in_executor(None, src.events_ready.wait, 10)
            model.gpu(NODE, 2).hang_seconds = 60.0
            hung = await src.poll()
            model.raise_xid(NODE, 2, 79)  # no poll after this point: what arrives came on the event path

            def xid79():
                return [r for batch in published for r in batch
                        if r.spec is M.XID and r.labels == {"gpu": "2", "uuid": model.gpu(NODE, 2).uuid, "xid": "79",
                                                           "action": "RESTART_BM"}]

            found = await await_for(xid79, timeout=10, interval=0.05, what="XID 79 published by the event thread")
            model.gpu(NODE, 2).hang_seconds = 0.0
            return first, hung, found
        finally:
            await src.close()

    first, hung, found = run(scenario)
    assert found[-1].value == 1.0
    assert one(hung, M.GPU_HUNG, gpu="2") == 1.0
    # with a stream attached the poll carries no XID series (one source of each series, never two)
    assert not values(first, M.XID) and not values(first, M.LAST_XID) and not values(hung, M.LAST_XID)
    # the first publish (at registration) lists every GPU's last XID, 0 before any event
    assert {r.labels["gpu"]: r.value for r in published[0] if r.spec is M.LAST_XID} == {str(i): 0.0 for i in range(GPUS)}
    last = {r.labels["gpu"]: r.value for r in published[-1] if r.spec is M.LAST_XID}
    assert last["2"] == 79.0 and last["0"] == 0.0


class NoEventsTwin(NvmlTwin):
    def nvmlEventSetCreate(self):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def test_an_event_stream_that_cannot_run_reads_down_not_zero(sim, model):
    """No event set: the stream's entry says so (down, with why) and no XID series pretend to count."""
    failed: list[tuple[str, str]] = []
    published: list = []

    async def scenario():
        src = NvmlSource(NoEventsTwin(sim.url, NODE), GPUS, LINKS, call_timeout=5.0, xid_events=True)
        src.event_stream.attach(published.append, every=60.0, fail=lambda kind, msg: failed.append((kind, msg)))
        try:
            res = await src.poll()
            await await_for(lambda: failed, timeout=10, what="the stream reported its failure")
            return res
        finally:
            await src.close()

    res = run(scenario)
    assert failed[0][0] == "driver" and "nvmlEventSetCreate" in failed[0][1] and not published
    assert not values(res, M.XID) and not values(res, M.LAST_XID)
    assert sorted(values(res, M.GPU_UP).values()) == [1.0] * GPUS


def test_power_limit_set_with_clamp_and_read_back(sim, model):
    twin = NvmlTwin(sim.url, NODE)
    twin.nvmlInit()
    try:
        assert set_power_limit(twin, 1, 50.0) == 200.0  # below min: clamped
        assert model.gpu(NODE, 1).power_limit_mw == 200_000
        assert get_power_limit(twin, 1) == 200.0
        assert set_power_limit(twin, 1, 9999.0) == 700.0  # above max: clamped
        assert set_power_limit(twin, 1, 350.4) == 350.4
        assert model.gpu(NODE, 1).power_limit_mw == 350_400
        model.step(10.0)
        assert model.gpu(NODE, 1).power_w == pytest.approx(350.4, abs=1.0)  # the cap really lowers power
        model.gpu(NODE, 3).lost = True
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            set_power_limit(twin, 3, 300.0)
        model.gpu(NODE, 2).unsupported = {"nvmlDeviceSetPowerManagementLimit"}
        with pytest.raises(pynvml.NVMLError_NotSupported):
            set_power_limit(twin, 2, 300.0)
        assert model.gpu(NODE, 2).power_limit_mw == 700_000
    finally:
        twin.nvmlShutdown()
    (res,) = run(lambda: poll_close(source(sim)))
    assert one(res, M.POWER_LIMIT, gpu="1", limit="current") == 350.4


def test_nvlink5_fields_give_ber_and_symbol_errors(sim, model):
    with model.lock:
        g = model.gpu(NODE, 0)
        g.nvlink_version = pynvml.NVML_NVLINK_VERSION_5_0
        g.nvlink_error_rate[1] = 8.0
    model.step(10.0)
    (res,) = run(lambda: poll_close(source(sim)))
    flit = model.gpu(NODE, 0).nvlink_errors[1][2]
    assert flit > 0
    assert one(res, M.NVLINK_ERRORS, gpu="0", link="1", type="symbol") == 4 * flit
    assert one(res, M.NVLINK_BER, gpu="0", link="1", kind="effective") == pytest.approx(8.0 / 8e11)
    assert one(res, M.NVLINK_BER, gpu="0", link="0", kind="effective") == 0.0
    assert not values(res, M.NVLINK_BER, gpu="1")


def test_one_http_request_per_cycle(sim):
    twin = NvmlTwin(sim.url, NODE)
    src = source(sim, lib=twin)

    async def scenario():
        try:
            await src.poll()
            before = twin.requests
            await src.poll()
            await src.poll()
            return twin.requests - before
        finally:
            await src.close()

    assert run(scenario) == 2


def test_unreachable_simulator_is_a_driver_error():
    src = NvmlSource(NvmlTwin(f"http://127.0.0.1:{free_port()}", NODE), GPUS, LINKS, call_timeout=5.0, xid_events=False)
    with pytest.raises(SourceError) as err:
        run(lambda: poll_close(src))
    assert err.value.kind == "driver" and "nvmlInit" in str(err.value)


def test_renumbered_gpu_carries_its_new_index_on_every_series(sim, model):
    """NVML renumbers when a GPU falls off the bus: the next GPU's info, field and link series all follow."""
    async def scenario():
        src = source(sim)
        try:
            await src.poll()
            await src.poll()  # steady state: NotSupported fields dropped, per-GPU plans built
            model.gpu(NODE, 0).missing = True
            return await src.poll()
        finally:
            await src.close()

    res = run(scenario)
    moved = model.gpu(NODE, 1).uuid
    mine = [r for r in res.readings if r.labels.get("uuid") == moved]
    assert {r.spec.name for r in mine} >= {M.GPU_INFO.name, M.TEMPERATURE.name, M.NVLINK_TX.name, M.NVLINK_UP.name}
    assert {r.labels["gpu"] for r in mine} == {"0"}
    assert one(res, M.TEMPERATURE, gpu="0", sensor="memory") == round(model.gpu(NODE, 1).mem_temp_c)


def test_field_answers_decode_every_value_type_as_the_struct_does():
    """The buffer decoding of a real pynvml c_nvmlFieldValue_t array agrees with reading each struct."""
    from exporters.gpu.nvml import _field_answers

    cases = [(pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 2.5e-9),
             (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 4_000_000_000),
             (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", 2**40 + 3),
             (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**63 + 5),
             (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -7), (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -9),
             (6, "usVal", 65535)]  # NVML_VALUE_TYPE_UNSIGNED_SHORT
    arr = (pynvml.c_nvmlFieldValue_t * (len(cases) + 1))()
    for fv, (vtype, attr, value) in zip(arr, cases):
        fv.fieldId, fv.valueType, fv.nvmlReturn = 100 + vtype, vtype, pynvml.NVML_SUCCESS
        setattr(fv.value, attr, value)
    arr[-1].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    got = _field_answers(arr, pynvml.NVML_SUCCESS)
    assert got[:-1] == [(pynvml.NVML_SUCCESS, float(value)) for _, _, value in cases]
    assert got[-1][0] == pynvml.NVML_ERROR_NOT_SUPPORTED and math.isnan(got[-1][1])
    # anything else shaped like the struct (a plain sequence of objects) is read attribute by attribute
    from types import SimpleNamespace as NS
    plain = [NS(nvmlReturn=0, valueType=3, value=NS(ullVal=12)), NS(nvmlReturn=pynvml.NVML_ERROR_UNKNOWN)]
    assert _field_answers(plain, 0)[0] == (0, 12.0) and _field_answers(plain, 0)[1][0] == pynvml.NVML_ERROR_UNKNOWN


def test_make_reading_is_the_same_reading():
    from exporters.model import Reading, make_reading

    labels = {"gpu": "0", "uuid": "GPU-x"}
    fast = make_reading(M.NVLINK_TX, 3.0, labels, Quality.OK, 12.5)
    slow = Reading(M.NVLINK_TX, 3.0, labels, Quality.OK, 12.5)
    assert fast == slow and type(fast) is Reading
    assert (fast.spec, fast.value, fast.labels, fast.quality, fast.timestamp) == (
        M.NVLINK_TX, 3.0, labels, Quality.OK, 12.5)
    with pytest.raises(AttributeError):
        fast.value = 4.0  # still frozen


def test_the_configs_xid_overrides_reach_the_nvml_sources_action_label(sim, model, tmp_path):
    """agent/sources.py builds the NVML source with remediation.xid_overrides: the counter says the overridden
    immediate action, as the judge uses it."""
    from agent.config import parse_config
    from agent.sources import build_sources
    from tests.test_config import minimal

    loaded = parse_config(minimal(
        tmp_path, inventory={"nodes": [NODE], "gpus": {"count": GPUS, "nvlinks_per_gpu": LINKS}},
        sources={"nvml": {"backend": "sim", "sim_url": sim.url}},
        remediation={"xid_overrides": {13: {"immediate_action": "RESET_GPU"}}}))
    src = next(s.source for s in build_sources(loaded) if s.source.name == "nvml")

    async def scenario():
        try:
            await src.poll()
            assert await asyncio.get_running_loop().run_in_executor(None, src.events_ready.wait, 10)
            model.raise_xid(NODE, 0, 13)

            async def seen():
                res = await src.poll()
                return values(res, M.XID, gpu="0", xid="13")
            return await await_for(seen, timeout=10, interval=0.05, what="xid 13 counted")
        finally:
            await src.close()

    assert [dict(k)["action"] for k in run(scenario)] == ["RESET_GPU"]
