"""GpuLanes: per-GPU budgets, with plain functions standing in for NVML calls (events, never sleeps)."""

from __future__ import annotations

import threading

import pytest

from exporters.gpu.nvml_lanes import GpuLanes
from tests.helpers import wait_for


def test_two_gpus_hung_in_one_cycle_the_rest_read_in_order_and_they_come_back():
    release = threading.Event()
    blocked = {0: True, 2: True}
    order: list[int] = []
    probes: list[int] = []

    def read(i: int) -> str:
        if blocked.get(i):
            release.wait(60)
        order.append(i)
        return f"gpu{i}"

    def probe(i: int) -> None:
        probes.append(i)

    lanes = GpuLanes(1.0, probe)
    try:
        results, hung = lanes.read(4, read)
        assert hung == [0, 2] and results == {1: "gpu1", 3: "gpu3"}
        assert order == [1, 3]
        started = lanes.threads_started  # the first worker, and one fresh worker per hung GPU
        assert started == 3
        assert lanes.read(4, read) == ({1: "gpu1", 3: "gpu3"}, [0, 2])  # skipped while their calls are blocked
        assert lanes.threads_started == started and not probes
        blocked.clear()
        release.set()  # the blocked calls return (their answers are dropped: they belong to a cycle given up on)
        wait_for(lambda: all(lanes._hung[i].idle.is_set() for i in (0, 2)), 10, what="blocked calls returned")
        assert lanes.read(4, read)[1] == [0, 2]  # still skipped: this cycle starts the probes
        wait_for(lambda: sorted(probes) == [0, 2] and all(lanes._hung[i].idle.is_set() for i in (0, 2)), 10,
                 what="probes answered")
        results, hung = lanes.read(4, read)
        assert hung == [] and results == {i: f"gpu{i}" for i in range(4)}
    finally:
        release.set()
        lanes.shutdown()


def test_a_bug_in_a_read_is_an_error_not_a_hang():
    def read(i: int) -> int:
        if i == 1:
            raise ValueError("decode bug")
        return i

    lanes = GpuLanes(5.0, lambda i: None)
    try:
        results, hung = lanes.read(3, read)
        assert hung == [] and results[0] == 0 and results[2] == 2
        assert isinstance(results[1], ValueError)
    finally:
        lanes.shutdown()


@pytest.mark.parametrize("count", [0, 1])
def test_a_hung_gpu_no_longer_enumerated_is_forgotten(count):
    release = threading.Event()
    lanes = GpuLanes(1.0, lambda i: None)
    try:
        assert lanes.read(2, lambda i: release.wait(60) if i == 1 else i)[1] == [1]
        assert lanes.read(count, lambda i: i) == ({i: i for i in range(count)}, [])
    finally:
        release.set()
        lanes.shutdown()
