"""LinkSource on fixture sysfs trees: IB states, counters growing and saturating, Ethernet, flaps."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from exporters.links.links import (LINK_CARRIER_CHANGES, LINK_ERRORS, LINK_FLAPS, LINK_IB_PHYS_STATE, LINK_RX_BYTES,
                             LINK_SATURATED, LINK_SPEED, LINK_UP, LinkSource)
from exporters.model import Quality, SourceError
from exporters.links.ports import PortSpec

FIX = Path(__file__).parent / "fixtures" / "links" / "sysfs"
IB = [PortSpec(f"mlx5_{i}/1", "ib") for i in range(4)]
ETH = [PortSpec(n) for n in ("eth0", "eth1", "eth2")]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(FIX, root)
    return root


def _by(readings, spec, label="port"):
    return {r.labels[label] if label == "port" else (r.labels["port"], r.labels[label]): r.value
            for r in readings if r.spec is spec}


def _poll(source: LinkSource):
    return asyncio.run(source.poll())


def _set(root: Path, rel: str, value: str) -> None:
    (root / rel).write_text(value + "\n")


def test_ib_states_rates_and_counters(tree: Path):
    source = LinkSource(IB, tree)
    result = _poll(source)
    assert result.partial_errors == {}
    assert _by(result.readings, LINK_UP) == {"mlx5_0/1": 1.0, "mlx5_1/1": 0.0, "mlx5_2/1": 0.0, "mlx5_3/1": 1.0}
    assert _by(result.readings, LINK_IB_PHYS_STATE) == {"mlx5_0/1": 5.0, "mlx5_1/1": 3.0, "mlx5_2/1": 2.0,
                                                        "mlx5_3/1": 5.0}
    assert _by(result.readings, LINK_SPEED)["mlx5_0/1"] == 200e9 / 8  # bytes per second
    errors = _by(result.readings, LINK_ERRORS, "counter")
    assert errors[("mlx5_0/1", "symbol_error")] == 12 and errors[("mlx5_0/1", "port_xmit_discards")] == 5
    assert {c for p, c in errors if p == "mlx5_0/1"} >= {
        "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors", "local_link_integrity_errors",
        "excessive_buffer_overrun_errors", "port_xmit_discards"}
    # port_rcv_data counts 4-octet words.
    assert _by(result.readings, LINK_RX_BYTES)["mlx5_0/1"] == 4 * 250000000
    assert all(r.labels["kind"] == "ib" for r in result.readings if r.spec is LINK_UP)
    asyncio.run(source.close())


def test_ib_saturated_counters_are_flagged(tree: Path):
    source = LinkSource(IB, tree)
    saturated = _by(_poll(source).readings, LINK_SATURATED, "counter")
    assert {k for k, v in saturated.items() if v} == {
        ("mlx5_3/1", "symbol_error"), ("mlx5_3/1", "link_downed"), ("mlx5_3/1", "local_link_integrity_errors")}
    # One below the maximum still counts; reaching it raises the flag.
    assert saturated[("mlx5_3/1", "port_rcv_errors")] == 0.0
    _set(tree, "class/infiniband/mlx5_3/ports/1/counters/port_rcv_errors", "65535")
    assert _by(_poll(source).readings, LINK_SATURATED, "counter")[("mlx5_3/1", "port_rcv_errors")] == 1.0


def test_ib_counters_grow_and_link_downed_counts_flaps(tree: Path):
    source = LinkSource(IB[:1], tree)
    first = _poll(source)
    assert _by(first.readings, LINK_FLAPS) == {"mlx5_0/1": 0.0}
    counters = tree / "class/infiniband/mlx5_0/ports/1/counters"
    _set(tree, str(counters / "symbol_error"), "500")
    _set(tree, str(counters / "link_downed"), "5")  # two downs and ups between polls; the port is up again
    second = _poll(source)
    assert _by(second.readings, LINK_ERRORS, "counter")[("mlx5_0/1", "symbol_error")] == 500
    assert _by(second.readings, LINK_FLAPS) == {"mlx5_0/1": 2.0}
    assert _by(second.readings, LINK_UP) == {"mlx5_0/1": 1.0}
    # Now the port is seen down: one more flap (the down counter moved with it, counted once).
    _set(tree, "class/infiniband/mlx5_0/ports/1/state", "1: DOWN")
    _set(tree, str(counters / "link_downed"), "6")
    third = _poll(source)
    assert _by(third.readings, LINK_UP) == {"mlx5_0/1": 0.0}
    assert _by(third.readings, LINK_FLAPS) == {"mlx5_0/1": 3.0}


def test_ethernet_state_counters_and_carrier_flaps(tree: Path):
    source = LinkSource(ETH, tree)
    result = _poll(source)
    assert _by(result.readings, LINK_UP) == {"eth0": 1.0, "eth1": 0.0, "eth2": 1.0}
    assert _by(result.readings, LINK_SPEED) == {"eth0": 100e9 / 8, "eth2": 25e9 / 8}  # eth1 is down: speed -1, not exported
    assert _by(result.readings, LINK_CARRIER_CHANGES) == {"eth0": 5.0, "eth1": 4.0, "eth2": 7.0}
    assert _by(result.readings, LINK_ERRORS, "counter")[("eth0", "rx_crc_errors")] == 2
    assert _by(result.readings, LINK_RX_BYTES)["eth0"] == 987654321
    # eth0 (has carrier_down_count) and eth2 (only carrier_changes) each go down and up twice between polls.
    _set(tree, "class/net/eth0/carrier_changes", "9")
    _set(tree, "class/net/eth0/carrier_down_count", "4")
    _set(tree, "class/net/eth2/carrier_changes", "11")
    # eth1 comes up (one change): not a flap.
    _set(tree, "class/net/eth1/operstate", "up")
    _set(tree, "class/net/eth1/carrier_changes", "5")
    _set(tree, "class/net/eth1/carrier_down_count", "2")
    second = _poll(source)
    assert _by(second.readings, LINK_FLAPS) == {"eth0": 2.0, "eth1": 0.0, "eth2": 2.0}
    # eth2 goes down and stays down, with only carrier_changes moving by one: one flap.
    _set(tree, "class/net/eth2/operstate", "down")
    _set(tree, "class/net/eth2/carrier_changes", "12")
    third = _poll(source)
    assert _by(third.readings, LINK_FLAPS)["eth2"] == 3.0
    assert _by(third.readings, LINK_UP)["eth2"] == 0.0


def _errors(readings) -> dict[tuple[str, str], tuple[float, float, Quality]]:
    return {(r.labels["port"], r.labels["counter"]): (r.value, r.timestamp, r.quality)
            for r in readings if r.spec is LINK_ERRORS}


def test_error_counters_are_read_every_counters_every_polls_and_at_once_after_a_missed_poll(tree: Path):
    """sources.links.counters_interval: error counters every fourth poll here (polls 1, 5, 9 while nothing is
    missed); state, traffic and the kernel's down count (flaps) every poll; in between the last read is given
    again with its own timestamp, and a port that missed a poll reads them at once."""
    ib = "class/infiniband/mlx5_0/ports/1"
    source = LinkSource([IB[0], ETH[0]], tree, counters_every=4)
    first = _errors(_poll(source).readings)
    assert first[("mlx5_0/1", "symbol_error")][0] == 12 and first[("eth0", "rx_crc_errors")][0] == 2
    _set(tree, f"{ib}/counters/symbol_error", "500")
    _set(tree, f"{ib}/counters/port_rcv_errors", "junk")  # a fault shows once its counter is read
    _set(tree, "class/net/eth0/statistics/rx_crc_errors", "9")
    _set(tree, f"{ib}/counters/link_downed", "5")  # two downs and ups: counted at once, not at the next read
    _set(tree, f"{ib}/counters/port_rcv_data", "250000100")
    for _ in range(3):  # polls 2 to 4: held
        result = _poll(source)
        errors = _errors(result.readings)
        assert errors[("mlx5_0/1", "symbol_error")] == first[("mlx5_0/1", "symbol_error")]  # value and timestamp
        assert errors[("eth0", "rx_crc_errors")] == first[("eth0", "rx_crc_errors")]
        assert errors[("mlx5_0/1", "link_downed")][0] == 5 and _by(result.readings, LINK_FLAPS)["mlx5_0/1"] == 2.0
        assert _by(result.readings, LINK_RX_BYTES)["mlx5_0/1"] == 4 * 250000100
        assert errors.keys() == first.keys()  # every counter given, once
        assert len([r for r in result.readings if r.spec is LINK_SATURATED]) == 12  # one per IB counter
    fifth = _poll(source)  # its turn: read
    errors = _errors(fifth.readings)
    assert errors[("mlx5_0/1", "symbol_error")][0] == 500 and errors[("eth0", "rx_crc_errors")][0] == 9
    assert errors[("mlx5_0/1", "port_rcv_errors")][2] is Quality.SENSOR_FAULT
    assert fifth.partial_errors == {"decode": 1}
    sixth = _errors(_poll(source).readings)  # the fault is held too, as a fault
    assert sixth[("mlx5_0/1", "port_rcv_errors")][2] is Quality.SENSOR_FAULT

    # mlx5_0 is gone for poll 7 (a driver reload): back at poll 8, it reads its counters at once; eth0, which
    # missed nothing, waits for its turn at poll 9.
    (tree / "class/infiniband/mlx5_0").rename(tree / "gone")
    assert not any(p == "mlx5_0/1" for p, _ in _errors(_poll(source).readings))
    (tree / "gone").rename(tree / "class/infiniband/mlx5_0")
    _set(tree, f"{ib}/counters/symbol_error", "3")  # reset by the reload
    _set(tree, "class/net/eth0/statistics/rx_crc_errors", "10")
    eighth = _errors(_poll(source).readings)
    assert eighth[("mlx5_0/1", "symbol_error")][0] == 3 and eighth[("eth0", "rx_crc_errors")][0] == 9
    assert _errors(_poll(source).readings)[("eth0", "rx_crc_errors")][0] == 10  # poll 9

    # A poll that fails as a whole (poll 10) breaks every port's chain: poll 11 reads them all, off its turn.
    (tree / "class").rename(tree / "elsewhere")
    with pytest.raises(SourceError):
        _poll(source)
    (tree / "elsewhere").rename(tree / "class")
    _set(tree, "class/net/eth0/statistics/rx_crc_errors", "11")
    assert _errors(_poll(source).readings)[("eth0", "rx_crc_errors")][0] == 11
    asyncio.run(source.close())


def test_missing_port_and_unreadable_state_are_partial(tree: Path):
    (tree / "class/net/eth1/operstate").unlink()
    source = LinkSource([PortSpec("eth0"), PortSpec("eth1"), PortSpec("eth9"), PortSpec("mlx5_9/1", "ib")], tree)
    result = _poll(source)
    up = {r.labels["port"]: r for r in result.readings if r.spec is LINK_UP}
    assert up["eth0"].value == 1.0 and up["eth9"].value == 0.0 and up["mlx5_9/1"].value == 0.0
    assert up["eth1"].quality is Quality.SENSOR_FAULT
    assert result.partial_errors == {"driver": 3}
    assert any("eth9" in p for p in source.last_problems)


def test_wrong_root_fails_the_source(tmp_path: Path):
    with pytest.raises(SourceError) as err:
        _poll(LinkSource(ETH, tmp_path / "nothing"))
    assert err.value.kind == "config"


def test_bad_port_names_are_refused():
    with pytest.raises(ValueError, match="device>/<port"):
        LinkSource([("mlx5_0", "ib")], FIX)
    with pytest.raises(ValueError, match="listed twice"):
        LinkSource([("eth0", "eth"), ("eth0", "eth")], FIX)
