"""/metrics answers gzip when the scraper asks (Prometheus does), plain text otherwise, and both say the same."""

from __future__ import annotations

import gzip
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.compression import accepts_gzip, encode
from tests.agentproc import base_config, running_agent
from tests.helpers import REPO, wait_for
from tests.peers import prometheus_server

GOLDEN = REPO / "tests" / "golden" / "metrics.txt"


def scrape(url: str, accept_encoding: str | None) -> tuple[dict[str, str], bytes]:
    """One GET of /metrics; urllib neither sends Accept-Encoding by itself nor decompresses."""
    req = urllib.request.Request(url + "/metrics", headers={"Accept-Encoding": accept_encoding} if accept_encoding else {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        return {k.lower(): v for k, v in resp.headers.items()}, resp.read()


def samples(body: bytes) -> list[tuple[tuple, float]]:
    """Every sample of an exposition, in order: ((name, sorted labels), value)."""
    return [((s.name, tuple(sorted(s.labels.items()))), s.value)
            for family in text_string_to_metric_families(body.decode()) for s in family.samples]


@pytest.mark.parametrize("header, wanted", [
    ("gzip", True), ("gzip, deflate, br", True), ("deflate, gzip;q=0.5", True), ("GZIP;Q=1", True), ("x-gzip", True),
    ("*", True), ("deflate, *;q=0.1", True),
    ("", False), ("identity", False), ("deflate", False), ("br, deflate", False), ("gzip;q=0", False),
    ("gzip;q=0.0", False), ("gzip;q=zero", False), ("*;q=0", False), ("gzip;q=0, *", False),
])
def test_accept_encoding_decides_gzip(header, wanted):
    assert accepts_gzip(header) is wanted


def test_gzip_round_trips_the_whole_rack_exposition_byte_for_byte():
    plain = GOLDEN.read_bytes()
    body, headers = encode(plain, "gzip")
    assert headers == {"Vary": "Accept-Encoding", "Content-Encoding": "gzip"}
    assert gzip.decompress(body) == plain
    assert len(body) < len(plain) // 4  # compressed, not merely wrapped
    assert encode(plain, "identity") == (plain, {"Vary": "Accept-Encoding"})


def test_a_real_scrape_gets_gzip_only_when_it_asks_and_the_same_exposition(tmp_path):
    with running_agent(base_config(tmp_path), tmp_path) as agent:
        wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="every source polled once")
        before_headers, before = scrape(agent.url, None)
        gz_headers, gz = scrape(agent.url, "gzip")  # exactly what Prometheus sends
        after_headers, after = scrape(agent.url, None)
        refused = [scrape(agent.url, h) for h in ("identity", "gzip;q=0", "deflate")]

    assert gz_headers.get("content-encoding") == "gzip", gz_headers
    assert "accept-encoding" in gz_headers.get("vary", "").lower()
    assert gz[:2] == b"\x1f\x8b"
    for headers, body in [(before_headers, before), (after_headers, after), *refused]:
        assert "content-encoding" not in headers, headers
        assert body.startswith(b"# HELP ")
    decompressed = samples(gzip.decompress(gz))
    plain_before, plain_after = samples(before), samples(after)
    # The same series in the same order; every value that held still across the bracketing plain scrapes
    # (all but the process's own CPU, memory and the like) is the same in the gzip one.
    assert [key for key, _ in decompressed] == [key for key, _ in plain_before] == [key for key, _ in plain_after]
    steady = [i for i, (b, a) in enumerate(zip(plain_before, plain_after)) if b[1] == a[1]]
    assert len(steady) > len(plain_before) // 2
    assert [decompressed[i] for i in steady] == [plain_before[i] for i in steady]


def test_prometheus_scrapes_the_gzip_exposition(tmp_path):
    """Prometheus sends `Accept-Encoding: gzip` on every scrape: the agent's series must arrive decoded."""
    with running_agent(base_config(tmp_path), tmp_path) as agent:
        job = [{"job_name": "agent", "static_configs": [{"targets": [f"127.0.0.1:{agent.port}"]}]}]
        with prometheus_server(tmp_path / "prom", job) as prom:
            info = wait_for(lambda: prom.query('supernode_agent_info{job="agent",node="node01"}'), 30,
                            interval=0.2, what="the agent's info series scraped")
            up = prom.query('up{job="agent"}')
    assert [r["value"][1] for r in info] == ["1"]
    assert [r["value"][1] for r in up] == ["1"]
