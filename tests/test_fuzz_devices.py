"""Property-based fuzzing of what devices send (issue 18): SNMP codec and decoder, Modbus codec, ethtool, sysfs.

The properties are the contract of untrusted input: whatever the bytes or
text, a parser returns or raises its own error (BerError), never anything
else; numbers come back within their type's range or as a fault; what a
parser calls good is finite. `make test` runs a small derandomized sample
(tests/conftest.py profiles); `make fuzz` runs the deep profile.
"""

from __future__ import annotations

import math

from hypothesis import assume, given
from hypothesis import strategies as st

from tests.bad_snmp_agent import _tlv, int_tlv, oid_tlv, response
from exporters.cooling import modbus_codec
from exporters.snmp import v2c as snmp_v2c
from exporters.links.dom import module_readings, parse_module
from exporters.links.links import parse_uint
from exporters.model import Quality
from exporters.snmp.decode import CounterTracker, decode
from exporters.snmp.profile import load_profile

SUBID = st.integers(0, snmp_v2c.MAX_SUBID)
OIDS = st.tuples(st.integers(0, 1), st.integers(0, 39)).flatmap(
    lambda head: st.lists(SUBID, max_size=snmp_v2c.MAX_OID_LENGTH - 2).map(lambda rest: head + tuple(rest)))
UNSIGNED_TAGS = {0x41: 32, 0x42: 32, 0x43: 32, 0x46: 64}


def _decodes_or_ber_error(data: bytes) -> None:
    try:
        request_id, status, index, varbinds = snmp_v2c.decode_response(data)
    except snmp_v2c.BerError:
        return
    assert all(isinstance(x, int) for x in (request_id, status, index))
    for oid, _ in varbinds:
        assert len(oid) <= snmp_v2c.MAX_OID_LENGTH and all(0 <= s <= snmp_v2c.MAX_SUBID + 80 for s in oid)


@given(st.binary(max_size=2048))
def test_any_bytes_decode_or_raise_ber_error_only(data):
    _decodes_or_ber_error(data)
    try:
        snmp_v2c.decode_header(data)
    except snmp_v2c.BerError:
        pass


@st.composite
def varbind(draw):
    """An encoded varbind: any OID, and a number of any width under any numeric tag, or a string."""
    oid = draw(OIDS)
    tag = draw(st.sampled_from([0x02, *UNSIGNED_TAGS, 0x04, 0x47, 0x1F]))
    if tag in (0x47, 0x1F):  # tags the codec does not know: a bad value, the response still reads
        return oid, tag, None, _tlv(0x30, oid_tlv(oid) + _tlv(tag, draw(st.binary(max_size=8))))
    if tag == 0x04:
        body = draw(st.binary(max_size=64))
        return oid, tag, body, _tlv(0x30, oid_tlv(oid) + _tlv(0x04, body))
    value = draw(st.one_of(st.integers(-(1 << 40), 1 << 70), st.integers(-(1 << 2000), 1 << 2000)))
    if tag != 0x02:
        value = abs(value)
    return oid, tag, value, _tlv(0x30, oid_tlv(oid) + int_tlv(tag, value))


@given(st.integers(-(1 << 31), (1 << 31) - 1), st.lists(varbind(), max_size=20))
def test_well_framed_responses_keep_oids_and_bound_numbers_by_type(request_id, vbs):
    rid, status, index, got = snmp_v2c.decode_response(response(request_id, [v[3] for v in vbs]))
    assert (rid, status, index) == (request_id, 0, 0)
    assert [o for o, _ in got] == [v[0] for v in vbs]
    for (_, tag, value, _), (_, decoded) in zip(vbs, got):
        if tag == 0x04:
            continue
        if value is None:
            assert isinstance(decoded, snmp_v2c.BadValue)
            continue
        lo, hi = (-(1 << 31), 1 << 31) if tag == 0x02 else (0, 1 << UNSIGNED_TAGS[tag])
        if lo <= value < hi:
            assert decoded == value
        else:
            assert isinstance(decoded, snmp_v2c.BadValue)


@given(st.lists(varbind(), min_size=1, max_size=8), st.data())
def test_mutated_responses_decode_or_raise_ber_error_only(vbs, data):
    message = bytearray(response(7, [v[3] for v in vbs]))
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        i = data.draw(st.integers(0, max(len(message) - 1, 0)))
        if op == "flip" and message:
            message[i] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del message[i:i + data.draw(st.integers(1, 8))]
        else:
            message[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    _decodes_or_ber_error(bytes(message))


@given(OIDS.filter(lambda o: len(o) >= 2))
def test_oids_round_trip_through_the_codec(oid):
    encoded = snmp_v2c.encode_oid(oid)
    tag, s, e = snmp_v2c._head(encoded, 0, len(encoded))
    assert tag == 0x06 and snmp_v2c.decode_oid(encoded, s, e) == oid


@given(st.integers(1, 5000))
def test_a_sub_identifier_over_32_bits_is_refused_at_any_length(nbytes):
    body = b"\x2b" + b"\x81" * nbytes + b"\x01"
    try:
        oid = snmp_v2c.decode_oid(body, 0, len(body))
    except snmp_v2c.BerError as exc:
        assert "32 bits" in str(exc)
    else:
        assert max(oid) <= snmp_v2c.MAX_SUBID


RARITAN = load_profile("raritan-pdu2")
ANY_VALUE = st.one_of(st.integers(-(1 << 80), 1 << 80), st.integers(-500, 500), st.text(max_size=8),
                      st.builds(snmp_v2c.BadValue, st.just("fuzz")), st.none())


COLUMNS = [oid for _, _, oid in RARITAN.walked_columns(slow=False) + RARITAN.walked_columns(slow=True)]


@given(st.lists(st.tuples(st.integers(1, 2), st.integers(1, 4), st.integers(1, 8)), max_size=4, unique=True),
       st.lists(ANY_VALUE, min_size=4 * len(COLUMNS), max_size=4 * len(COLUMNS)))
def test_the_pdu_decoder_never_raises_and_good_readings_are_finite(rows, values):
    it = iter(values)
    columns = {oid: {r: next(it) for r in rows} for oid in COLUMNS}
    readings = decode(RARITAN, columns, "pdu-a", CounterTracker(), {}, now=0.0)
    for r in readings:
        if r.quality is Quality.OK:
            assert math.isfinite(r.value)


WORDS = st.integers(0, 0xFFFF)


@given(st.sampled_from(["u16", "i16", "u32", "i32", "f32"]), st.sampled_from(["ABCD", "CDAB", "BADC", "DCBA"]),
       st.lists(WORDS, min_size=2, max_size=2))
def test_modbus_words_always_decode_to_a_number_of_their_type(dtype, order, words):
    value = modbus_codec.decode(words[:modbus_codec.WIDTH[dtype]], dtype, order)
    if dtype == "f32":
        assert isinstance(value, float)  # NaN and inf included: the point's range check faults them
    else:
        bits = 16 * modbus_codec.WIDTH[dtype]
        lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if dtype[0] == "i" else (0, 1 << bits)
        assert lo <= value < hi
        assert modbus_codec.decode(modbus_codec.encode(value, dtype, order), dtype, order) == value


@given(st.sampled_from(["ABCD", "CDAB", "BADC", "DCBA"]), st.floats(width=32, allow_nan=False))
def test_modbus_floats_round_trip(order, value):
    got = modbus_codec.decode(modbus_codec.encode(value, "f32", order), "f32", order)
    assert got == value or (math.isnan(got) and math.isnan(value))


@given(st.lists(WORDS, max_size=3), st.sampled_from(["u16", "u32", "f32"]))
def test_modbus_decode_of_the_wrong_word_count_is_a_value_error(words, dtype):
    assume(len(words) != modbus_codec.WIDTH[dtype])
    try:
        modbus_codec.decode(words, dtype)
    except ValueError:
        return
    raise AssertionError("decoded a wrong number of words")


LABELS = ["Module temperature", "Module voltage", "Laser bias current (Channel 1)", "Laser output power",
          "Receiver signal average optical power", "Rcvr signal avg optical power(Channel 2)",
          "Transmit avg optical power (Channel 3)", "Laser bias current high alarm", "Module voltage low warning",
          "Laser rx power high alarm threshold", "Vendor name", "Optical diagnostics support"]
VALUE_TEXT = st.one_of(
    st.text(max_size=40),
    st.builds(lambda n, u: f"{n} {u}", st.one_of(st.floats(), st.integers(-10 ** 30, 10 ** 30), st.text(max_size=6)),
              st.sampled_from(["mW", "dBm", "mA", "V", "degrees C", "mW / -inf dBm", "On", "Off"])),
    st.builds(lambda c, n: c * n, st.sampled_from([" ", "1", "\t", "1.", ":"]), st.integers(0, 3000)))


@given(st.lists(st.tuples(st.sampled_from(LABELS), VALUE_TEXT), max_size=20), st.text(max_size=200))
def test_ethtool_text_never_raises_and_values_are_finite_or_dark(lines, noise):
    text = "\n".join(f"\t{label:<42}: {value}" for label, value in lines) + "\n" + noise
    dom = parse_module(text)
    for quantity, lanes in dom.lanes.items():
        for v in lanes.values():
            assert math.isfinite(v) or (v == -math.inf and quantity.endswith("power"))
    for v in (dom.temperature, dom.voltage, *dom.thresholds.values()):
        assert v is None or math.isfinite(v)
    for r in module_readings("eth0", dom):
        assert r.quality is Quality.SENSOR_FAULT or not math.isnan(r.value)


@given(st.text(max_size=40))
def test_sysfs_numbers_are_ascii_digits_within_64_bits(text):
    v = parse_uint(text)
    ascii_digits = text.isascii() and text.isdigit()
    if v is None:
        assert not ascii_digits or len(text) > 20 or int(text) >= 1 << 64
    else:
        assert ascii_digits and v == int(text) and 0 <= v < 1 << 64


@given(st.integers(0, (1 << 64) - 1))
def test_every_64_bit_counter_reads_back(n):
    assert parse_uint(str(n)) == n

