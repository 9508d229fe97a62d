"""A shared fact is checked against what this agent's own source of that device can publish, before it is stored.

Real sources (a Modbus leak controller and CDU, an SNMP PDU and CDU, a Redfish CDU, never polled here) declare their
families and the label values they decide; facts built from those are taken unchanged, and anything else
(arbitrary JSON, a forged family, label or zone, another device's identity, a time in the future) is a
RecordError naming why: never another exception, never a reading in the store.
"""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.config import SourceSettings, parse_config
from agent.coordination import build_coordinator
from agent.coordination.etcd import KV
from agent.coordination.exchange import FactExchange
from agent.coordination.facts import Fact, FactSchema, decode, encode, parse
from agent.coordination.records import RecordError
from agent.snapshot import SnapshotStore
from exporters.cooling import modbus_metrics as mm
from exporters.cooling.modbus import ModbusSource
from exporters.cooling.snmp_cdu import SnmpCduSource
from exporters.model import Kind, MetricSpec, Quality, make_reading
from exporters.power.pdu import PduSource
from exporters.snmp.client import SnmpCredentials
from exporters.redfish.client import RedfishClient
from exporters.redfish.source import RedfishSource

SKEW = 5.0
PAST = 1.7e9  # a fixed time before now (a strategy may not depend on the clock)
LEAK_ZONES = {1: "zone-a", 2: "zone-b", 3: "zone-c"}
SOURCES = {
    "leak/leak1": ModbusSource("leak", "leak1", "rle-ld2100", channels=LEAK_ZONES),
    "leak/cdu1": ModbusSource("leak", "cdu1", "reference-cdu", subset="leak", channels={1: "zone-a", 2: "zone-b"}),
    "cdu/cdu1": ModbusSource("cdu", "cdu1", "reference-cdu", subset="cdu", channels={1: "zone-a", 2: "zone-b"}),
    "pdu/pdu-a": PduSource("pdu-a", "raritan-pdu2", ("127.0.0.1", 9), SnmpCredentials(version="2c", community="public"),
                           outlet_feeds={"1": "node01", "2": "node02"}),
    "leak/cdu2": SnmpCduSource("leak", "cdu2", "apc-inrow-rc", ("127.0.0.1", 9), SnmpCredentials(community="public"),
                               channels={1: "zone-b"}, subset="leak"),
    "cdu/cdu2": SnmpCduSource("cdu", "cdu2", "apc-inrow-rc", ("127.0.0.1", 9), SnmpCredentials(community="public"),
                              channels={1: "zone-b"}, subset="cdu"),
    "redfish/rfcdu1": RedfishSource("rfcdu1", RedfishClient("https://127.0.0.1:9"), kind="cdu", zone="zone-a",
                                    events="off"),
}
SCHEMAS = {job: FactSchema.of(job, src) for job, src in SOURCES.items()}
LEAK1 = SCHEMAS["leak/leak1"]


class _Runner:
    settings = SourceSettings(interval=0.5)

    def __init__(self, source):
        self.source = source


def _exchange() -> FactExchange:
    store = SnapshotStore()
    fx = FactExchange("node03", {job: job.split("/", 1)[1] for job in SOURCES}, 3.0, time.time,
                      frozenset({"leak/leak1"}), SKEW)
    fx.store = store
    fx.runners = {job: _Runner(src) for job, src in SOURCES.items()}
    for job in SOURCES:
        store.register(*job.split("/", 1), 0.5, 3.0)
    return fx


def _wet(zone: str = "zone-a", sensor: str = "zone-1", at: float | None = None, **doc) -> bytes:
    t = time.time() if at is None else at
    r = make_reading(mm.LEAK_DETECTED, 1.0, {"zone": zone, "sensor": sensor}, Quality.OK, t)
    raw = json.loads(encode(Fact("node01", "leak", "leak1", True, [r], 0.01, at=t + 0.01)))
    raw.update(doc)
    return json.dumps(raw).encode()


def _why(raw: bytes, poller: str = "node01", schema: FactSchema = LEAK1) -> str:
    with pytest.raises(RecordError) as exc:
        decode(parse(raw), schema, poller, time.time(), SKEW)
    return exc.value.why


# -- the attacks of issue 31, one by one -------------------------------------------------------------------

def test_a_fact_filed_under_one_device_cannot_speak_for_another_or_for_another_poller():
    assert _why(_wet(source="dom", device="node03")) == "mismatch"
    assert _why(_wet(device="leak2")) == "mismatch"
    assert _why(_wet(), poller="node02") == "mismatch", "its node must be the poller it was filed by"
    assert _why(_wet(), schema=SCHEMAS["cdu/cdu1"]) == "mismatch"


def test_times_later_than_the_allowed_skew_are_rejected():
    now = time.time()
    assert _why(_wet(at=now + 3600)) == "future"
    doc = json.loads(_wet())
    doc["r"][0][4] = now + 10 * SKEW  # one reading dated ahead, the fact's own time fine
    assert _why(json.dumps(doc).encode()) == "future"
    for bad in ("NaN", -1.0, "soon", None):
        doc["r"][0][4] = bad
        assert _why(json.dumps(doc).encode()) in ("range", "type")
    fact = decode(parse(_wet(at=now + SKEW / 2)), LEAK1, "node01", now, SKEW)
    assert fact.readings[0].value == 1.0, "within the skew: a clock a little ahead is fine"


def test_forged_families_labels_and_zones_are_rejected():
    doc = json.loads(_wet())
    row = doc["r"][0]
    cases = {
        "unknown_family": [["supernode_forged_total", 1.0, {}, "ok", row[4]]],
        "labels": [["supernode_leak_detected", 1.0, {"zone": "zone-a"}, "ok", row[4]],
                   ["supernode_leak_detected", 1.0, {"zone": "zone-a", "sensor": "zone-1", "x": "y"}, "ok", row[4]]],
        "label_value": [["supernode_leak_detected", 1.0, {"zone": "zone-a", "sensor": "forged"}, "ok", row[4]],
                        ["supernode_leak_detected", 1.0, {"zone": "zone-q", "sensor": "zone-1"}, "ok", row[4]],
                        ["supernode_leak_detected", 1.0, {"zone": "zone-a", "sensor": "zone-1\u202e"}, "ok", row[4]],
                        ["supernode_modbus_requests_total", 1.0, {"device": "node03"}, "ok", row[4]]],
        "quality": [["supernode_leak_detected", 1.0, {"zone": "zone-a", "sensor": "zone-1"}, "great", row[4]]],
        "range": [["supernode_leak_detected", math.inf, {"zone": "zone-a", "sensor": "zone-1"}, "ok", row[4]]],
        "type": [["supernode_leak_detected", "1", {"zone": "zone-a", "sensor": "zone-1"}, "ok", row[4]]],
    }
    for why, rows in cases.items():
        for bad in rows:
            doc["r"] = [row, bad]
            assert _why(json.dumps(doc).encode()) == why, bad


def test_an_snmp_cdus_facts_are_checked_like_a_modbus_cdus():
    t = time.time()

    def fact(job: str, spec, value: float, **labels: str) -> bytes:
        source, device = job.split("/", 1)
        return encode(Fact("node01", source, device, True, [make_reading(spec, value, labels, Quality.OK, t)], 0.01,
                           at=t + 0.01))
    wet = decode(parse(fact("leak/cdu2", mm.LEAK_DETECTED, 1.0, zone="zone-b", sensor="inrow-leak")),
                 SCHEMAS["leak/cdu2"], "node01", time.time(), SKEW)
    assert wet.readings[0].labels == {"zone": "zone-b", "sensor": "inrow-leak"}
    # its wiring decides the zone, its profile the sensor; its loop is no family of its leak poll
    assert _why(fact("leak/cdu2", mm.LEAK_DETECTED, 1.0, zone="zone-a", sensor="inrow-leak"),
                schema=SCHEMAS["leak/cdu2"]) == "label_value"
    assert _why(fact("leak/cdu2", mm.FLOW, 0.002, cdu="cdu2", loop="secondary"),
                schema=SCHEMAS["leak/cdu2"]) == "unknown_family"
    assert _why(fact("cdu/cdu2", mm.FLOW, 0.002, cdu="cdu1", loop="secondary"),
                schema=SCHEMAS["cdu/cdu2"]) == "label_value"  # another CDU's name


def test_the_receivers_own_specs_are_used_whatever_the_payload_declares():
    doc = json.loads(_wet())
    doc["specs"] = {"supernode_leak_detected": ["counter", "forged help", ["zone"], "joules"]}
    fact = decode(parse(json.dumps(doc).encode()), LEAK1, "node01", time.time(), SKEW)
    assert fact.readings[0].spec is mm.LEAK_DETECTED


def test_a_sensor_fault_may_carry_any_number_an_ok_reading_only_a_finite_one():
    t = time.time()
    readings = [make_reading(mm.LEAK_DETECTED, math.nan, {"zone": "zone-a", "sensor": "zone-1"},
                             Quality.SENSOR_FAULT, t),
                make_reading(mm.LEAK_FAULT, math.inf, {"zone": "zone-b", "sensor": "zone-2", "fault": "cable_break"},
                             Quality.SENSOR_FAULT, t)]
    fact = decode(parse(encode(Fact("node01", "leak", "leak1", True, readings, 0.0, at=t))), LEAK1, "node01", t, SKEW)
    assert math.isnan(fact.readings[0].value) and fact.readings[1].value == math.inf


def test_the_exchange_names_unknown_jobs_and_leaves_the_store_alone_on_a_rejected_fact():
    fx = _exchange()
    with pytest.raises(RecordError) as exc:
        fx.check("dom/node03", "node01", _wet())
    assert exc.value.why == "unknown_job"
    with pytest.raises(RecordError):
        fx.ingest("leak/leak1", "node01", _wet(zone="zone-q"), lambda device: False)
    assert fx.store.snapshot().value(mm.LEAK_DETECTED.name, zone="zone-q", sensor="zone-1") is None
    assert fx.ingest("leak/leak1", "node01", _wet(), lambda device: False) is None
    assert fx.store.snapshot().value(mm.LEAK_DETECTED.name, zone="zone-a", sensor="zone-1") == 1.0


# -- properties ------------------------------------------------------------------------------------------------

_printable = st.text(st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")),
                     max_size=20).filter(str.isprintable)


@st.composite
def _readings(draw, schema: FactSchema):
    out = []
    for _ in range(draw(st.integers(0, 8))):
        name = draw(st.sampled_from(sorted(schema.families)))
        spec = schema.families[name]
        labels = {k: draw(st.sampled_from(sorted(schema.pinned[k])) if k in schema.pinned else _printable)
                  for k in spec.labels}
        quality = draw(st.sampled_from(list(Quality)))
        value = draw(st.floats(allow_nan=False, allow_infinity=False) if quality is Quality.OK else st.floats())
        out.append(make_reading(spec, value, labels, quality, draw(st.floats(0, PAST))))
    return out


def _same(a, b) -> bool:
    return (a.spec is b.spec and dict(a.labels) == dict(b.labels) and a.quality is b.quality
            and a.timestamp == b.timestamp and (a.value == b.value or (math.isnan(a.value) and math.isnan(b.value))))


@given(st.sampled_from(sorted(SCHEMAS)).flatmap(lambda job: st.tuples(st.just(job), _readings(SCHEMAS[job]))),
       st.booleans(), st.floats(0, 60), st.dictionaries(st.sampled_from(["timeout", "exception_2"]),
                                                         st.integers(0, 10**6), max_size=2))
def test_a_fact_its_device_could_publish_round_trips(job_readings, up, duration, partial):
    job, readings = job_readings
    schema = SCHEMAS[job]
    now = time.time()
    sent = Fact("node01", schema.source, schema.device, up, readings, duration, "" if up else "poll",
                "" if up else "timeout", partial, now)
    got = decode(parse(encode(sent)), schema, "node01", now, SKEW)
    assert (got.node, got.source, got.device, got.up, got.duration, got.partial_errors, got.at) == \
        (sent.node, sent.source, sent.device, sent.up, sent.duration, sent.partial_errors, sent.at)
    assert len(got.readings) == len(readings) and all(_same(a, b) for a, b in zip(got.readings, readings))


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                     max_leaves=12)
_FIELDS = ["v", "node", "source", "device", "up", "duration", "at", "specs", "r", "error_kind", "error", "partial"]


@given(st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=4), st.integers(0, 4), _json)
def test_any_payload_is_a_fact_or_a_rejection_never_another_error(replace, row_field, cell):
    """A valid fact with any fields replaced by any JSON, or one reading's cell replaced; and any JSON at all."""
    fx = _exchange()
    doc = json.loads(_wet())
    doc.update(replace)
    if isinstance(doc.get("r"), list) and doc["r"] and isinstance(doc["r"][0], list) \
            and row_field < len(doc["r"][0]):  # a replaced "r" may hold shorter rows than the one drawn into
        doc["r"][0][row_field] = cell
    for raw in (json.dumps(doc).encode(), json.dumps(cell).encode(), json.dumps(doc).encode()[:-3]):
        try:
            fact = fx.check("leak/leak1", "node01", raw)
        except RecordError as exc:
            assert exc.why and str(exc).isprintable()
            continue
        assert all(r.spec is LEAK1.families[r.spec.name] for r in fact.readings)
        assert fact.at <= time.time() + SKEW


@given(st.binary(max_size=300))
def test_any_bytes_are_a_fact_or_a_rejection(raw):
    try:
        _exchange().check("leak/leak1", "node01", raw)
    except RecordError:
        pass


def test_a_source_without_declared_families_shares_nothing():
    class Bare:
        name, device = "leak", "leak1"

    with pytest.raises(RecordError) as exc:
        FactSchema.of("leak/leak1", Bare())
    assert exc.value.why == "unknown_job"
    assert MetricSpec("x_info", Kind.INFO, "") not in SCHEMAS["leak/leak1"].families.values()


# -- who may file a fact: the transports' checks, on real coordinators built from a config -------------------

INVENTORY = {"nodes": ["n1", "n2", "n3"],
             "leak_controllers": [{"name": "leak1", "profile": "rle-ld2100", "port": 1502}]}


def _coordinator(tmp_path, **coordination):
    loaded = parse_config({"agent": {"rack": "r1", "node": "n1", "state_dir": str(tmp_path)},
                           "inventory": dict(INVENTORY, agent_urls={n: "http://127.0.0.1:9" for n in ("n2", "n3")}),
                           "coordination": coordination})
    c = build_coordinator(loaded)
    store = SnapshotStore()
    store.register("leak", "leak1", 0.5, 3.0)
    c.facts.store = store
    c.facts.runners = {"leak/leak1": _Runner(ModbusSource("leak", "leak1", "rle-ld2100"))}  # zones leak1-ch<n>
    return c


def _line(node: str) -> bytes:
    t = time.time()
    r = make_reading(mm.LEAK_DETECTED, 1.0, {"zone": "leak1-ch1", "sensor": "zone-1"}, Quality.OK, t)
    return encode(Fact(node, "leak", "leak1", True, [r], 0.01, at=t))


def _wet_in_store(c) -> float | None:
    return c.facts.store.snapshot().value(mm.LEAK_DETECTED.name, zone="leak1-ch1", sensor="zone-1")


def test_static_takes_a_fact_only_from_a_configured_pollers_own_stream(tmp_path):
    c = _coordinator(tmp_path, pollers={"leak1": ["n2"]})
    c._from_peer("n3", _line("n3"), 1)  # n3 is no poller of leak1
    c._from_peer("n2", _line("n3"), 1)  # n2's stream speaking for n3
    assert _wet_in_store(c) is None
    assert c.rejections.counts == {("fact", "not_poller"): 1, ("fact", "mismatch"): 1}
    c._from_peer("n2", _line("n2"), 1)
    assert _wet_in_store(c) == 1.0


def test_etcd_takes_a_fact_only_under_its_pollers_slot_lease(tmp_path):
    c = _coordinator(tmp_path, backend="etcd", etcd={"endpoints": ["http://127.0.0.1:9"]})
    root = c.root

    def kv(key: str, value: bytes, lease: int, rev: int) -> KV:
        return KV(f"{root}/{key}", value, rev, rev, lease)

    rack = [kv("members/n2", b"n2", 7, 1), kv("members/n3", b"n3", 9, 2), kv("pollers/leak1/0", b"n2", 7, 3)]
    forged = [kv("facts/leak/leak1/n3", _line("n3"), 9, 4),  # a live member holding no slot
              kv("facts/leak/leak1/n2", _line("n2"), 8, 5),  # the poller's name under another lease
              kv("facts/leak/leak1/n2", _line("n2"), 0, 6),  # ... or none
              kv("facts/leak/leak1/ghost", _line("ghost"), 7, 7),  # the poller's lease under another name
              kv("facts/dom/n1/n2", _line("n2"), 7, 8)]  # a job that is no shared device
    def in_key_order(kvs: list[KV]) -> list[KV]:  # as a range read returns them: facts/ before members/, pollers/
        return sorted(kvs, key=lambda kv: kv.key)

    c._load(in_key_order(rack + forged))
    assert _wet_in_store(c) is None
    assert c.rejections.counts == {("fact", "no_slot"): 1, ("fact", "not_member"): 3, ("fact", "unknown_job"): 1}
    c._load(in_key_order(rack + [kv("facts/leak/leak1/n2", _line("n2"), 7, 9)]))  # checked after the slots
    assert _wet_in_store(c) == 1.0
