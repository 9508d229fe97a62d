"""The v2c client without pysnmp's engine: BER codec against pyasn1, segmented walks, tooBig, truncation, retries."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from pyasn1.codec.ber import decoder, encoder
from pysnmp.proto import api, rfc1902, rfc1905

from sim.snmp_agent import OidTable, SnmpAgent, gauge, integer, text
from exporters.snmp import v2c as snmp_v2c
from exporters.model import SourceError
from exporters.snmp.client import MAX_CURSORS, SnmpClient, SnmpCredentials
from exporters.snmp.v3 import to_python

P = api.PROTOCOL_MODULES[api.SNMP_VERSION_2C]
COL_A = (1, 3, 6, 1, 4, 1, 99999, 1, 1, 4)
COL_B = (1, 3, 6, 1, 4, 1, 99999, 1, 1, 5)
SMALL = (1, 3, 6, 1, 4, 1, 99999, 2, 1, 4)


def dotted(oid: tuple[int, ...]) -> str:
    return ".".join(map(str, oid))


def table(rows: int = 144) -> dict:
    items = {COL_A + (1, r): gauge(r * 10) for r in range(1, rows + 1)}
    items.update({COL_B + (1, r): integer(7 if r % 2 else 8) for r in range(1, rows + 1)})
    items.update({SMALL + (p,): gauge(p) for p in (1, 2, 3)})
    items[(1, 3, 6, 1, 2, 1, 1, 1, 0)] = text("simulated")
    return items


class Agent(SnmpAgent):
    """The simulator's agent, plus misbehaviour: tooBig past `max_varbinds`, truncation, dropped requests."""

    def __init__(self, max_varbinds: int | None = None, truncate: int | None = None, drop: int = 0):
        super().__init__("public")
        self.max_varbinds, self.truncate, self.drop = max_varbinds, truncate, drop
        self.sizes: list[int] = []  # varbinds per request

    def _answer(self, data: bytes) -> bytes | None:
        if self.drop:
            self.drop -= 1
            return None
        req, _ = decoder.decode(data, asn1Spec=P.Message())
        pdu = P.apiMessage.get_pdu(req)
        self.sizes.append(len(P.apiPDU.get_varbinds(pdu)))
        if pdu.isSameTypeWith(P.GetBulkRequestPDU()) and self.max_varbinds is not None:
            asked = len(P.apiPDU.get_varbinds(pdu)) * int(P.apiBulkPDU.get_max_repetitions(pdu))
            if asked > self.max_varbinds:
                rsp = P.apiMessage.get_response(req)
                P.apiPDU.set_error_status(P.apiMessage.get_pdu(rsp), 1)
                return encoder.encode(rsp)
        rsp_data = super()._answer(data)
        if self.truncate is None or rsp_data is None:
            return rsp_data
        rsp, _ = decoder.decode(rsp_data, asn1Spec=P.Message())
        rsp_pdu = P.apiMessage.get_pdu(rsp)
        vbs = P.apiPDU.get_varbinds(rsp_pdu)
        P.apiPDU.set_varbinds(rsp_pdu, vbs[:self.truncate])
        return encoder.encode(rsp)


@contextlib.asynccontextmanager
async def rig(agent: Agent | None = None, items: dict | None = None, timeout: float = 5.0, retries: int = 0):
    """An in-process agent and a client of it. The client's default bound is long: the agent encodes its answers with
    pysnmp on the test's own event loop, and a 31-segment GETBULK answer took more than 0.5 s on a loaded 2-core
    host (a walk test then failed as a timeout); the tests of timeouts pass their own short bound."""
    agent = agent or Agent()
    agent.table = OidTable(items if items is not None else table())
    host, port = await agent.start("127.0.0.1", 0)
    client = SnmpClient(host, port, SnmpCredentials(community="public"), timeout=timeout, retries=retries)
    try:
        yield agent, client
    finally:
        client.close()
        agent.stop()


def expected(items: dict, col: tuple[int, ...]) -> dict[tuple[int, ...], int]:
    return {k[len(col):]: int(v) for k, v in sorted(items.items()) if k[:len(col)] == col}


def pyasn1_message(pdu_type, varbinds, request_id=4711, community="public"):
    msg, pdu = P.Message(), pdu_type()
    P.apiPDU.set_defaults(pdu)
    P.apiPDU.set_request_id(pdu, request_id)
    P.apiPDU.set_varbinds(pdu, varbinds)
    P.apiMessage.set_defaults(msg)
    P.apiMessage.set_community(msg, community)
    P.apiMessage.set_pdu(msg, pdu)
    return msg


def test_requests_encode_as_pyasn1_reads_them():
    oids = [(1, 3, 6, 1, 2, 1, 1, 1, 0), (1, 3, 6, 1, 4, 1, 13742, 6, 5, 4, 3, 1, 4, 1, 24, 14), (2, 999, 3, 1 << 31)]
    raw = snmp_v2c.encode_request(snmp_v2c.GETBULK, 123456789, b"public", [(o, snmp_v2c.NULL) for o in oids], 0, 10)
    msg, rest = decoder.decode(raw, asn1Spec=P.Message())
    assert rest == b""
    pdu = P.apiMessage.get_pdu(msg)
    assert pdu.isSameTypeWith(P.GetBulkRequestPDU()) and bytes(P.apiMessage.get_community(msg)) == b"public"
    assert int(P.apiPDU.get_request_id(pdu)) == 123456789 and int(P.apiBulkPDU.get_max_repetitions(pdu)) == 10
    assert [tuple(n) for n, _ in P.apiPDU.get_varbinds(pdu)] == oids
    # byte-identical to pyasn1's own encoding of the same SET
    mine = snmp_v2c.encode_request(snmp_v2c.SET, 7, b"private", [(oids[1], snmp_v2c.integer(-129))])
    theirs = encoder.encode(pyasn1_message(P.SetRequestPDU, [(oids[1], rfc1902.Integer32(-129))], 7, "private"))
    assert mine == theirs
    with pytest.raises(SourceError) as err:
        snmp_v2c.encode_request(snmp_v2c.GET, 1, b"public", [((1, 40, 1), snmp_v2c.NULL)])
    assert err.value.kind == "config"


def test_responses_of_every_value_type_decode_like_pysnmp_values():
    base = (1, 3, 6, 1, 4, 1, 99999, 1 << 28)
    values = [rfc1902.Integer32(-2147483648), rfc1902.Integer32(0), rfc1902.Gauge32(4294967295),
              rfc1902.Counter32(4294967295), rfc1902.Counter64(18446744073709551615), rfc1902.TimeTicks(123456),
              rfc1902.OctetString("PX3-5190R"), rfc1902.OctetString(b"\xff\x00\x81"), rfc1902.IpAddress("10.0.0.1"),
              rfc1902.ObjectName((1, 3, 6, 1, 4, 1, 13742)), rfc1902.Opaque(b"\x9f\x78\x04"),
              rfc1905.noSuchObject, rfc1905.noSuchInstance, rfc1905.endOfMibView,
              rfc1902.OctetString("x" * 300)]  # long-form lengths (> 255 bytes message)
    vbs = [(base + (i,), v) for i, v in enumerate(values)]
    msg = pyasn1_message(P.ResponsePDU, vbs, request_id=2 ** 31 - 1)
    P.apiPDU.set_error_status(P.apiMessage.get_pdu(msg), 5)
    P.apiPDU.set_error_index(P.apiMessage.get_pdu(msg), 2)
    request_id, status, index, got = snmp_v2c.decode_response(encoder.encode(msg))
    assert (request_id, status, index) == (2 ** 31 - 1, 5, 2)
    assert [o for o, _ in got] == [o for o, _ in vbs]
    # what the engine path (pysnmp objects through to_python) gives, value for value
    assert [v for _, v in got] == [snmp_v2c.END if to_python(v) is None else to_python(v) for v in values]
    assert [v for _, v in got][:9] == [-2147483648, 0, 4294967295, 4294967295, 18446744073709551615, 123456,
                                       "PX3-5190R", "ff0081", "\n\x00\x00\x01"]
    assert snmp_v2c.error_name(status) == "genErr"
    for bad in (b"", b"\x30\x03\x02\x01\x00", encoder.encode(pyasn1_message(P.GetRequestPDU, vbs[:1])),
                encoder.encode(msg)[:-3]):
        with pytest.raises(snmp_v2c.BerError):
            snmp_v2c.decode_response(bad)


def test_second_walk_splits_long_columns_and_reads_the_same_rows():
    items = table()
    cols = [dotted(COL_A), dotted(COL_B), dotted(SMALL)]

    async def run():
        async with rig(items=items) as (agent, client):
            first = await client.walk_columns(cols, 10)
            assert client.requests == 15  # 144 rows at 10 a request, the three columns side by side
            assert first[cols[0]] == expected(items, COL_A) and first[cols[1]] == expected(items, COL_B)
            assert first[cols[2]] == {(1,): 1, (2,): 2, (3,): 3}
            second = await client.walk_columns(cols, 10)
            assert client.requests == 16 and agent.sizes[-1] == 15 + 15 + 1  # one request, 31 segments
            assert second == first and list(second[cols[0]]) == sorted(second[cols[0]])
            # rows appear and disappear between walks: segments still cover the whole column
            changed = dict(items)
            del changed[COL_A + (1, 10)], changed[COL_A + (1, 50)]
            changed[COL_A + (1, 50, 1)] = gauge(5)
            changed[COL_A + (1, 200)] = gauge(2000)
            changed[COL_A + (1, 145)] = gauge(1450)
            agent.table = OidTable(changed)
            third = await client.walk_columns(cols, 10)
            assert third[cols[0]] == expected(changed, COL_A)
            assert third[cols[1]] == expected(changed, COL_B)
            # an agent with fewer rows: empty columns, no error
            agent.table = OidTable({k: v for k, v in items.items() if k[:len(COL_B)] != COL_B})
            fourth = await client.walk_columns(cols, 10)
            assert fourth[cols[1]] == {} and fourth[cols[0]] == expected(items, COL_A)

    asyncio.run(run())


def test_segments_stay_within_the_cursor_budget():
    items = {COL_A + (r,): gauge(r) for r in range(1, 2001)}

    async def run():
        async with rig(items=items) as (agent, client):
            await client.walk_columns([dotted(COL_A)], 10)
            again = await client.walk_columns([dotted(COL_A)], 10)
            assert again[dotted(COL_A)] == expected(items, COL_A)
            assert max(agent.sizes[-5:]) <= MAX_CURSORS and agent.sizes[-1] <= MAX_CURSORS

    asyncio.run(run())


@pytest.mark.parametrize("agent_kw", [{"max_varbinds": 25}, {"max_varbinds": 1}, {"truncate": 7}])
def test_too_big_and_truncated_answers_still_read_every_row(agent_kw):
    items = table(40)
    cols = [dotted(COL_A), dotted(COL_B), dotted(SMALL)]

    async def run():
        async with rig(Agent(**agent_kw), items=items) as (agent, client):
            for _ in range(2):  # plain walk, then segmented
                got = await client.walk_columns(cols, 10)
                assert got[cols[0]] == expected(items, COL_A) and got[cols[1]] == expected(items, COL_B)
                assert got[cols[2]] == expected(items, SMALL)

    asyncio.run(run())


def test_get_set_and_errors():
    items = table(4)

    async def run():
        async with rig(items=items, timeout=0.2, retries=1) as (agent, client):
            got = await client.get(["1.3.6.1.2.1.1.1.0", dotted(COL_A + (1, 3)), dotted(COL_A + (1, 99))])
            assert got == {"1.3.6.1.2.1.1.1.0": "simulated", dotted(COL_A + (1, 3)): 30, dotted(COL_A + (1, 99)): None}
            with pytest.raises(SourceError) as err:  # the simulator's agent refuses SETs without a handler
                await client.set_int(dotted(COL_B + (1, 1)), 2)
            assert err.value.kind == "protocol" and "notWritable" in str(err.value)
            agent.on_set = lambda oid, value: value
            await client.set_int(dotted(COL_B + (1, 1)), 2)
            agent.drop = 1  # first try lost: the retry (same request-id) is answered
            assert (await client.get(["1.3.6.1.2.1.1.1.0"]))["1.3.6.1.2.1.1.1.0"] == "simulated"
            agent.drop = 2
            with pytest.raises(SourceError) as err:
                await client.get(["1.3.6.1.2.1.1.1.0"])
            assert err.value.kind == "timeout" and "2 tries" in str(err.value)
            # concurrent requests on one socket are told apart by request-id
            many = await asyncio.gather(*(client.get([dotted(COL_A + (1, r))]) for r in (1, 2, 3, 4)))
            assert [list(m.values())[0] for m in many] == [10, 20, 30, 40]

    asyncio.run(run())


def test_wrong_community_times_out_and_a_client_reopens_on_a_new_event_loop():
    agent = Agent()
    results: list = []

    async def both():
        agent.table = OidTable(table(4))
        host, port = await agent.start("127.0.0.1", 0)
        wrong = SnmpClient(host, port, SnmpCredentials(community="nope"), timeout=0.2, retries=0)
        with pytest.raises(SourceError) as err:
            await wrong.get(["1.3.6.1.2.1.1.1.0"])
        results.append(err.value.kind)
        wrong.close()
        client = SnmpClient(host, port, SnmpCredentials(community="public"), timeout=0.5, retries=0)

        # one `asyncio.run` per call (a sync caller, on a thread): the client reopens on each new loop
        def twice() -> list:
            return [asyncio.run(client.get(["1.3.6.1.2.1.1.1.0"])) for _ in range(2)]

        results.append(await asyncio.to_thread(twice))
        client.close()
        agent.stop()

    asyncio.run(both())
    assert results == ["timeout", [{"1.3.6.1.2.1.1.1.0": "simulated"}] * 2]
    with pytest.raises(SourceError) as err:
        SnmpClient("127.0.0.1", 161, SnmpCredentials(community=None))
    assert err.value.kind == "config"


def test_the_simulators_read_answers_are_byte_for_byte_what_pysnmp_encodes():
    """The simulated agent puts a read's answer together from varbinds encoded once per table; every read kind
    (a GET of a present and an absent OID, a GETNEXT within and past the end, a GETBULK with a non-repeater and
    columns running off the end, a Counter64 and a long string among the values) answers exactly the bytes
    pysnmp's message API builds for it, twice (the second from the cache)."""
    items = table(rows=40)
    items[(1, 3, 6, 1, 4, 1, 9, 1)] = rfc1902.Counter64(2 ** 63 + 5)
    items[(1, 3, 6, 1, 4, 1, 9, 2)] = text("x" * 300)  # long form lengths, in the varbind and around it
    agent = SnmpAgent("public")
    agent.table = OidTable(items)
    last = max(items)

    def request(pdu: object, names: list[tuple[int, ...]], request_id: int) -> bytes:
        P.apiPDU.set_defaults(pdu)
        P.apiPDU.set_request_id(pdu, request_id)
        P.apiPDU.set_varbinds(pdu, [(n, P.Null("")) for n in names])
        msg = P.Message()
        P.apiMessage.set_defaults(msg)
        P.apiMessage.set_community(msg, "public")
        P.apiMessage.set_pdu(msg, pdu)
        return encoder.encode(msg)

    bulk = P.GetBulkRequestPDU()
    P.apiBulkPDU.set_defaults(bulk)
    P.apiBulkPDU.set_non_repeaters(bulk, 1)
    P.apiBulkPDU.set_max_repetitions(bulk, 30)
    requests = [
        request(P.GetRequestPDU(), [(1, 3, 6, 1, 2, 1, 1, 1, 0), (1, 3, 6, 1, 9, 9), (1, 3, 6, 1, 4, 1, 9, 1)], 7),
        request(P.GetNextRequestPDU(), [COL_A, last], 2 ** 31 - 1),
        request(bulk, [(1, 3, 6, 1, 2, 1, 1, 1), COL_A + (1, 35), COL_B, (1, 3, 6, 1, 4, 1, 9)], 123456),
    ]
    for data in requests * 2:
        fast = agent._answer(data)
        assert fast is not None and fast == agent._answer_with_pysnmp(data), decoder.decode(fast, asn1Spec=P.Message())
