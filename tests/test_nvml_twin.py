"""The NVML twin behaves like nvidia-ml-py where the exporter can tell: error classes, types, constants."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest
import yaml

from sim.nvml_twin import NvmlTwin
from sim.rack import RackModel
from exporters.gpu.nvml_profile import ProfileError, load_profile
from tests.nvml_sim import serve

NODE = "node01"


@pytest.fixture
def model() -> RackModel:
    m = RackModel(nodes=1, gpus_per_node=2, nvlinks=4, seed=5)
    m.step(1.0)
    return m


@pytest.fixture
def twin(model):
    for srv in serve(model):
        t = NvmlTwin(srv.url, NODE)
        t.nvmlInit()
        yield t
        t.nvmlShutdown()


def raised(fn, *args):
    with pytest.raises(pynvml.NVMLError) as e:
        fn(*args)
    return type(e.value)


def test_uninitialized_raises_the_same_class_as_pynvml(model):
    for srv in serve(model):
        fresh = NvmlTwin(srv.url, NODE)
        # the real library, with no driver loaded and no nvmlInit, refuses the same way
        assert raised(fresh.nvmlDeviceGetCount) is raised(pynvml.nvmlDeviceGetCount) is pynvml.NVMLError_Uninitialized


@pytest.mark.parametrize("code,setup,call", [
    (pynvml.NVML_ERROR_GPU_IS_LOST, lambda g: setattr(g, "lost", True), lambda t, h: t.nvmlDeviceGetPowerUsage(h)),
    (pynvml.NVML_ERROR_NOT_SUPPORTED, lambda g: g.unsupported.add("nvmlDeviceGetPowerUsage"),
     lambda t, h: t.nvmlDeviceGetPowerUsage(h)),
    (pynvml.NVML_ERROR_INVALID_ARGUMENT, lambda g: None, lambda t, h: t.nvmlDeviceGetNvLinkState(h, 99)),
    (pynvml.NVML_ERROR_INVALID_ARGUMENT, lambda g: None, lambda t, h: t.nvmlDeviceSetPowerManagementLimit(h, 10)),
    (pynvml.NVML_ERROR_TIMEOUT, lambda g: None, lambda t, h: t.nvmlEventSetWait_v2(t.nvmlEventSetCreate(), 10)),
    (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, lambda g: None, lambda t, h: t.nvmlDeviceGetFanSpeed(h)),
])
def test_twin_raises_pynvmls_own_subclasses(twin, model, code, setup, call):
    h = twin.nvmlDeviceGetHandleByIndex(1)
    setup(model.gpu(NODE, 1))
    twin._state = None  # the fault is set behind the twin's back: do not wait out the cache
    cls = raised(call, twin, h)
    assert cls is pynvml.nvmlExceptionClass(code)
    assert issubclass(cls, pynvml.NVMLError) and cls is not pynvml.NVMLError
    assert cls(code).value == code


def test_constants_and_types_are_pynvmls(twin):
    assert twin.NVML_TEMPERATURE_GPU is pynvml.NVML_TEMPERATURE_GPU
    assert twin.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    assert twin.c_nvmlFieldValue_t is pynvml.c_nvmlFieldValue_t
    h = twin.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(twin.nvmlDeviceGetMemoryInfo(h), pynvml.c_nvmlMemory_t)
    assert isinstance(twin.nvmlDeviceGetUtilizationRates(h), pynvml.c_nvmlUtilization_t)
    pci = twin.nvmlDeviceGetPciInfo(h)
    assert isinstance(pci, pynvml.nvmlPciInfo_t) and pci.busId == "00000000:18:00.0" and pci.bus == 0x18
    assert isinstance(twin.nvmlDeviceGetUUID(h), str)
    assert twin.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)


def test_field_values_carry_their_own_return_codes(twin, model):
    model.gpu(NODE, 0).nvlink_errors[2][0] = 11
    twin._state = None
    h = twin.nvmlDeviceGetHandleByIndex(0)
    fv = twin.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_MEMORY_TEMP,
                                           (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, 2),
                                           (pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER, 0),
                                           (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, 40)])
    assert all(isinstance(v, pynvml.c_nvmlFieldValue_t) for v in fv)
    assert [v.nvmlReturn for v in fv] == [pynvml.NVML_SUCCESS, pynvml.NVML_SUCCESS,
                                          pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT]
    assert fv[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT and fv[0].value.uiVal == round(model.gpu(NODE, 0).mem_temp_c)
    assert fv[1].scopeId == 2 and fv[1].value.ullVal == 11


def test_events_only_for_registered_gpus(twin, model):
    es = twin.nvmlEventSetCreate()
    model.raise_xid(NODE, 1, 31)  # GPU 1 is never registered on this set: never delivered
    h0 = twin.nvmlDeviceGetHandleByIndex(0)
    twin.nvmlDeviceRegisterEvents(h0, pynvml.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(pynvml.NVMLError_Timeout):
        twin.nvmlEventSetWait_v2(es, 50)
    model.raise_xid(NODE, 0, 94)
    d = twin.nvmlEventSetWait_v2(es, 2000)
    assert (d.eventType, d.eventData, twin.nvmlDeviceGetUUID(d.device)) == (
        pynvml.nvmlEventTypeXidCriticalError, 94, model.gpu(NODE, 0).uuid)
    twin.nvmlEventSetFree(es)


def test_profile_ids_match_installed_pynvml():
    prof = load_profile()
    entries = prof.all_named()
    assert len(entries) > 20
    for path, name, ident in entries:
        assert hasattr(pynvml, name), f"{path}: pynvml has no {name}"
        assert getattr(pynvml, name) == ident, f"{path}: {name} is {getattr(pynvml, name)} in pynvml, profile says {ident}"


@pytest.mark.parametrize("text,where", [
    ("gpu_fields: {memory_temp: {name: X, id: -1}}", "gpu_fields.memory_temp.id"),
    ("nvlink_fields: [{name: X, id: 1, metric: volts}]", "nvlink_fields[0].metric"),
    ("nvlink_fields: [{name: X, id: 1, metric: errors}]", "nvlink_fields[0].label"),
    ("temperature_thresholds: [1, 2]", "temperature_thresholds"),
])
def test_bad_profile_names_the_field(tmp_path: Path, text: str, where: str):
    # the shipped profile with one section replaced by a bad one
    base = yaml.safe_load((Path(__file__).resolve().parent.parent / "exporters/profiles/nvml.yaml").read_text())
    base.update(yaml.safe_load(text))
    p = tmp_path / "nvml.yaml"
    p.write_text(yaml.safe_dump(base))
    with pytest.raises(ProfileError) as e:
        load_profile(p)
    assert where in str(e.value)


def test_field_values_are_fresh_arrays_packed_once_per_fetched_state(twin, model):
    ids = [pynvml.NVML_FI_DEV_POWER_INSTANT, (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 1),
           (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 3)]
    h = twin.nvmlDeviceGetHandleByIndex(0)
    first = twin.nvmlDeviceGetFieldValues(h, ids)
    first[1].value.ullVal = 999_999  # a caller's array is its own, as with pynvml
    again = twin.nvmlDeviceGetFieldValues(h, ids)
    assert again is not first and again[1].value.ullVal == int(model.gpu(NODE, 0).nvlink_tx_kib[1])
    assert [(v.fieldId, v.scopeId, v.valueType) for v in again] == [
        (pynvml.NVML_FI_DEV_POWER_INSTANT, 0, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 1, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG),
        (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 3, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT)]
    assert again[2].value.uiVal == 1 and again[0].timestamp > 0
    model.gpu(NODE, 0).nvlink_up[3] = False
    twin._state = None  # the next call fetches a new state: new answers
    assert twin.nvmlDeviceGetFieldValues(h, ids)[2].value.uiVal == 0


def _blocked_call(fn, *args):
    """Run fn(*args) on a thread of its own; (thread, outcome list) so a test can see whether it returned."""
    import threading

    out: list = []

    def run():
        try:
            out.append(fn(*args))
        except pynvml.NVMLError as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_hung_gpu_blocks_only_its_own_handle_until_cleared(twin, model):
    from sim.nvml_faults import clear_gpu_faults, set_hang
    from tests.helpers import wait_for

    h0, h1 = twin.nvmlDeviceGetHandleByIndex(0), twin.nvmlDeviceGetHandleByIndex(1)
    set_hang(model, NODE, 1, 60.0)
    twin._state = None
    before = twin.requests
    t, out = _blocked_call(twin.nvmlDeviceGetPowerUsage, h1)
    wait_for(lambda: twin.requests >= before + 3, 10, what="the hung call rechecking the simulator")
    # the other GPU, and the driver as a whole, answer while GPU 1's call is blocked
    assert twin.nvmlDeviceGetPowerUsage(h0) > 0
    assert twin.nvmlDeviceGetCount() == 2
    assert t.is_alive() and not out
    clear_gpu_faults(model)
    wait_for(lambda: not t.is_alive(), 10, what="hung call returns once the hang is cleared")
    assert isinstance(out[0], int)


def test_a_hung_driver_blocks_every_call_until_cleared(twin, model):
    from sim.nvml_faults import clear_gpu_faults, set_driver_hang
    from tests.helpers import wait_for

    h0 = twin.nvmlDeviceGetHandleByIndex(0)
    set_driver_hang(model, NODE, 60.0)
    twin._state = None
    before = twin.requests
    count, count_out = _blocked_call(twin.nvmlDeviceGetCount)
    power, power_out = _blocked_call(twin.nvmlDeviceGetPowerUsage, h0)
    wait_for(lambda: twin.requests >= before + 6, 10, what="both calls rechecking the simulator")
    assert count.is_alive() and power.is_alive() and not count_out and not power_out
    clear_gpu_faults(model, NODE)
    wait_for(lambda: not count.is_alive() and not power.is_alive(), 10, what="calls return once cleared")
    assert count_out == [2] and isinstance(power_out[0], int)


def test_a_state_fetched_across_a_write_is_not_cached_so_the_writers_read_back_sees_it(twin, model):
    """Another thread's fetch of the node's state that began before a power-limit write and ends after it holds the
    old limit; kept as the cache, the writer's read-back would see the old limit, which a driver never answers."""
    import threading

    h = twin.nvmlDeviceGetHandleByIndex(0)
    before = twin.nvmlDeviceGetPowerManagementLimit(h)
    fetched, release = threading.Event(), threading.Event()
    real_request = twin._request

    def request_then_wait(method, path, *args, **kwargs):
        reply = real_request(method, path, *args, **kwargs)
        if method == "GET" and path == "/state" and threading.current_thread().name == "slow-fetch":
            fetched.set()  # the old state is in hand; its caller stores it only after the write below
            release.wait(10)
        return reply

    twin._request = request_then_wait
    slow = threading.Thread(target=twin._fetch, name="slow-fetch")
    slow.start()
    assert fetched.wait(10)
    twin.nvmlDeviceSetPowerManagementLimit(h, before - 100_000)
    release.set()
    slow.join(10)
    assert twin.nvmlDeviceGetPowerManagementLimit(h) == before - 100_000
    assert model.gpu(NODE, 0).power_limit_mw == before - 100_000
