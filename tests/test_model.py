"""The shared reading model."""

from __future__ import annotations


def test_readings_carry_their_unit():
    from exporters.model import Reading, counter, gauge

    assert Reading(gauge("supernode_cdu_flow_cubic_meters_per_second", "x"), 1.0).as_dict()["unit"] == \
        "cubic_meters_per_second"
    assert counter("supernode_gpu_energy_joules_total", "x").unit == "joules"
    assert gauge("supernode_gpu_up", "x").unit == ""
    assert gauge("supernode_x_watts", "x", unit="kilowatts").unit == "kilowatts"  # an explicit unit wins
