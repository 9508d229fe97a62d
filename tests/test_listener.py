"""The real daemon's listener under abuse (issue 18, item 1 and the listener "Low" items): half-sent requests
under a 1024 file limit, header and body deadlines, the connection cap, Host allow-list, `Server` header."""

from __future__ import annotations

import logging
import re
import resource
import socket


from agent.listener import RateLimitFilter, connection_cap
from tests.agentproc import base_config, running_agent
from tests.helpers import wait_for

HALF_SENT = b"GET /api/v1/state HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def fd_limit_1024() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def half_sent(port: int, n: int) -> list[socket.socket]:
    """n connections, each with a request whose headers never end (kept open by the caller)."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        try:
            s.sendall(HALF_SENT)
        except OSError:  # already closed by the agent to make room: still one attacker's try
            pass
        socks.append(s)
    return socks


def closed_by_peer(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset: closed too
        return True


def raw_request(port: int, head: bytes, body: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_1100_half_sent_connections_under_1024_fds_leave_metrics_answering(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1400:  # this test process holds the 1,100 client sockets itself
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    cfg = base_config(tmp_path)
    cfg["listen"]["header_timeout_seconds"] = 300  # only the cap can save the day here, not the deadline
    with running_agent(cfg, tmp_path, preexec=fd_limit_1024) as agent:
        socks = half_sent(agent.port, 1100)
        try:
            assert wait_for(lambda: agent.get("/metrics")[0] == 200, 60, what="/metrics during the attack")
            assert agent.get("/healthz")[0] == 200
            assert agent.get("/api/v1/state")[0] == 200
            assert agent.proc.poll() is None
            closed = sum(closed_by_peer(s) for s in socks)
            assert closed >= 1100 - 512, closed  # the cap (512 by default) made room by closing the oldest
            evicted = re.search(r'^supernode_http_connections_closed_total\{reason="evicted"\} (\S+)$',
                                agent.metrics(), re.M)
            assert evicted and float(evicted.group(1)) >= 1100 - 512
        finally:
            for s in socks:
                s.close()
        log = agent.log()
        assert "out of system resource" not in log
        assert len(log.splitlines()) < 40, log[-3000:]  # eviction notices are rate-limited


def test_a_request_whose_headers_never_end_is_closed_at_the_deadline(tmp_path):
    cfg = base_config(tmp_path)
    cfg["listen"]["header_timeout_seconds"] = 1
    with running_agent(cfg, tmp_path) as agent:
        (s,) = half_sent(agent.port, 1)
        try:
            wait_for(lambda: closed_by_peer(s), 30, interval=0.1, what="the agent closing a half-sent request")
        finally:
            s.close()
        # A slow but finished request in between is still answered.
        assert agent.get("/healthz")[0] == 200


def test_a_body_that_never_arrives_gets_408(tmp_path):
    cfg = base_config(tmp_path)
    cfg["listen"]["body_timeout_seconds"] = 1
    with running_agent(cfg, tmp_path) as agent:
        head = (b"POST /-/reload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n"
                b"Authorization: Bearer admin-token-for-tests\r\n\r\n")
        answer = raw_request(agent.port, head, b"x" * 10)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert agent.get("/metrics")[0] == 200


def test_connection_cap_closes_the_oldest_waiting_connection(tmp_path):
    cfg = base_config(tmp_path)
    cfg["listen"].update(max_connections=8, header_timeout_seconds=300)
    with running_agent(cfg, tmp_path) as agent:
        socks = half_sent(agent.port, 40)
        try:
            assert agent.get("/metrics")[0] == 200
            wait_for(lambda: closed_by_peer(socks[0]), 20, interval=0.05, what="the oldest evicted")
            open_now = [s for s in socks if not closed_by_peer(s)]
            assert len(open_now) <= 8, len(open_now)
            assert socks[-1] in open_now  # the newest is kept; the oldest go first
            assert re.search(r"^supernode_http_connections_max 8\.0$", agent.metrics(), re.M)
        finally:
            for s in socks:
                s.close()


def test_host_allow_list_refuses_rebinding_names(tmp_path):
    cfg = base_config(tmp_path)
    cfg["listen"]["allowed_hosts"] = ["127.0.0.1", "agent.rack01.example"]
    with running_agent(cfg, tmp_path) as agent:
        def status(host: bytes) -> bytes:
            return raw_request(agent.port, b"GET /metrics HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")[:12]
        assert status(b"evil.example") == b"HTTP/1.1 421"
        assert status(b"evil.example:%d" % agent.port) == b"HTTP/1.1 421"
        assert status(b"127.0.0.1:%d" % agent.port) == b"HTTP/1.1 200"
        assert status(b"AGENT.rack01.example") == b"HTTP/1.1 200"


def test_server_header_names_no_version(tmp_path):
    with running_agent(base_config(tmp_path), tmp_path) as agent:
        for head in (b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                     b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                     b"GARBAGE\x00 / HTTP/1.1\r\n\r\n"):
            answer = raw_request(agent.port, head)
            server = [line for line in answer.split(b"\r\n") if line.lower().startswith(b"server:")]
            assert server == [b"Server: supernode-agent"], answer[:300]


def test_rate_limit_filter_bounds_a_flood_and_counts_what_it_dropped():
    now = [0.0]
    limiter = RateLimitFilter(every=10, clock=lambda: now[0])
    logger = logging.getLogger("test.flood")
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger.addHandler(Keep())
    logger.addFilter(limiter)
    logger.propagate = False
    try:
        for i in range(2000):  # 2,000 accept errors in one second, as in the issue
            now[0] = i / 2000
            logger.error("socket.accept() out of system resource")
        now[0] = 11
        logger.error("socket.accept() out of system resource")
        logger.error("another message")
    finally:
        logger.removeFilter(limiter)
    assert records[0] == "socket.accept() out of system resource"
    assert "1999 similar messages suppressed" in records[1]
    assert records[2] == "another message" and len(records) == 3


def test_connection_cap_stays_under_the_file_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert connection_cap(512) == 192
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        assert connection_cap(512) == 512 and connection_cap(5000) == 1024 - 228
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_body_over_the_limit_is_413_and_the_connection_still_has_a_header_deadline(tmp_path):
    cfg = base_config(tmp_path)
    cfg["listen"].update(max_body_bytes=1024, header_timeout_seconds=1)
    with running_agent(cfg, tmp_path) as agent:
        with socket.create_connection(("127.0.0.1", agent.port), timeout=30) as s:
            s.sendall(b"POST /-/reload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5000\r\n"
                      b"Authorization: Bearer admin-token-for-tests\r\n\r\n" + b"x" * 5000)
            answer = s.recv(65536)
            assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
            s.sendall(HALF_SENT)  # then a request that never ends on the same connection
            wait_for(lambda: closed_by_peer(s), 30, interval=0.1, what="the header deadline after a 413")
