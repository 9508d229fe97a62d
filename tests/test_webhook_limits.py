"""Webhook input an attacker with the token controls (issue 18 item 8 and the webhook "Low" items): nothing grows
without bound, nothing answers 500, and every string shown in the CLI is terminal-safe."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json

import aiohttp
import pytest

from agent.remediation import webhook
from agent.remediation.api import cli_incidents, cli_journal
from exporters.validation import terminal_safe
from agent.remediation.webhook import WebhookError, handle_payload

from tests.remediation_support import engine
from tests.test_webhook import ADMIN, TOKEN, alert, payload, serve


def nvlink(node="node01", gpu="0", link="0", fp=None, **extra) -> dict:
    labels = {"alertname": "SupernodeNvlinkErrors", "detector": "nvlink_errors", "node": node, "gpu": gpu,
              "link": link, "severity": "warning", **extra}
    return alert(fp=fp or f"{node}-{gpu}-{link}", labels=labels)


def body(*alerts) -> bytes:
    return json.dumps(payload(*alerts)).encode()


def with_engine(tmp_path, check) -> object:
    """Run `await check(eng)` against a started observe-mode engine, stopped afterwards."""
    async def main():
        eng = engine(tmp_path, mode="observe")
        await eng.start()
        try:
            return await check(eng)
        finally:
            await eng.stop()
    return asyncio.run(main())


def status_of(eng, data: bytes) -> int:
    try:
        handle_payload(eng, data)
    except WebhookError as exc:
        return exc.status
    return 200


@pytest.mark.parametrize("gpu", ["²", "٣", "0" * 5000, "4", "-1", " 1", "1e2", "９"])
def test_gpu_label_must_be_an_ascii_index_in_the_inventory(tmp_path, gpu):
    async def check(eng):
        assert status_of(eng, body(nvlink(gpu=gpu))) == 422
        assert not eng.incidents.open_incidents()
        assert status_of(eng, body(nvlink(gpu="3", link="17"))) == 200
        assert status_of(eng, body(nvlink(gpu="3", link="18", fp="x"))) == 422  # 18 NVLinks: 0..17
    with_engine(tmp_path, check)


def test_unknown_alertnames_are_counted_not_stored(tmp_path):
    async def check(eng):
        before = {m.name: len(m.samples) for m in eng.collector().collect()}
        for round_ in range(5):
            alerts = [alert(name=f"Spam{round_}-{i}\x1b[2J", fp=f"s{round_}-{i}") for i in range(1000)]
            assert handle_payload(eng, body(*alerts)) == {"accepted": 0, "duplicates": 0, "ignored": 1000}
        assert not eng.incidents.open_incidents() and not eng.incidents.opened_total
        assert eng.journal._db.execute("SELECT COUNT(*) FROM webhook_alerts").fetchone()[0] == 0
        families = {m.name: m for m in eng.collector().collect()}
        # no new family and no new series: the known detectors' zero series only, none named by the spam
        assert {name: len(m.samples) for name, m in families.items() if name != "supernode_webhook_alerts_ignored"} \
            == {name: n for name, n in before.items() if name != "supernode_webhook_alerts_ignored"}
        assert not [s for s in families["supernode_incident_open"].samples if s.labels["detector"].startswith("Spam")]
        assert all(s.value == 0 for s in families["supernode_incident_open"].samples)
        ignored = {s.labels["reason"]: s.value for s in families["supernode_webhook_alerts_ignored"].samples
                   if s.name.endswith("_total")}
        assert ignored == {"unknown_alertname": 5000, "incident_cap": 0}
    with_engine(tmp_path, check)


def test_open_incidents_from_the_webhook_are_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(webhook, "MAX_OPEN_FROM_WEBHOOK", 5)

    async def check(eng):
        out = handle_payload(eng, body(*[nvlink(gpu=str(g), link=str(k)) for g in range(2) for k in range(5)]))
        assert out == {"accepted": 5, "duplicates": 0, "ignored": 5}
        assert len(eng.incidents.open_incidents()) == 5
        assert eng.webhook_ignored == {"incident_cap": 5}
        # an open one can still be re-sent and resolved; resolving makes room again
        resolved = {**nvlink(gpu="0", link="0"), "status": "resolved", "fingerprint": "r00"}
        assert handle_payload(eng, body(resolved))["accepted"] == 1
        assert handle_payload(eng, body(nvlink(gpu="1", link="4", fp="again")))["accepted"] == 1
    with_engine(tmp_path, check)


def test_labels_and_severity_are_bounded(tmp_path):
    async def check(eng):
        assert status_of(eng, body(nvlink(summary="x" * 5000))) == 422
        many = nvlink(**{f"l{i}": "v" for i in range(100)})
        assert status_of(eng, body(many)) == 422
        handle_payload(eng, body(nvlink(gpu="1", severity="\x1b[31m" + "s" * 500)))
        (inc,) = eng.incidents.open_incidents()
        assert inc.severity == "warning"
    with_engine(tmp_path, check)


def test_deeply_nested_json_is_400_over_http_not_500(tmp_path):
    async def check(eng):
        runner, url, _ = await serve(eng, max_body=1 << 20)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as s:
            for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
                        body(nvlink())[:-1] + b', "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
                async with s.post(url + "/api/v1/alerts", data=raw, headers=auth) as r:
                    assert 400 <= r.status < 500, (r.status, raw[:40])
        await runner.cleanup()
    with_engine(tmp_path, check)


def test_terminal_safe_escapes_control_and_format_characters():
    assert terminal_safe("node01") == "node01"
    assert terminal_safe("a\x1b[2Jb\nc\u202ed\x07") == "a\\x1b[2Jb\\nc\\u202ed\\x07"
    assert "\x1b" not in terminal_safe("\x1b]0;title\x07")


def test_incidents_and_journal_cli_render_hostile_strings_inert(tmp_path):
    bad = "node\x1b[2J\x1b[31mRED\nSECOND LINE\u202e"

    async def check(eng):
        eng.fire("gpu_thermal", {"node": bad}, "warning", "local", {"error": bad})
        eng.journal.append("result", action="notify", target=bad, result="failed", detail={"error": bad})
        runner, url, _ = await serve(eng)
        (tmp_path / "admin.token").write_text(ADMIN)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = await asyncio.to_thread(cli_incidents, url, tmp_path / "admin.token")
        await runner.cleanup()
        return rc, out.getvalue()

    rc, text = with_engine(tmp_path, check)
    assert rc == 0 and "node\\x1b[2J" in text, text
    assert "\x1b" not in text and "\u202e" not in text and "SECOND LINE" in text
    assert len(text.splitlines()) == 3  # mode line, header, one incident: the newline did not split the row
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_journal(tmp_path / "journal.db") == 0
    assert "\x1b" not in out.getvalue() and "\\n" in out.getvalue()
    assert all("SECOND LINE" not in line or "node" in line for line in out.getvalue().splitlines())


def test_cli_prints_a_message_when_something_else_answers_on_the_port(tmp_path, capsys):
    """Not the agent (a proxy's HTML page, a reused port): a message and exit 1, no traceback."""
    import http.server
    import threading

    class Html(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>\x1b[2J not the agent</html>")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Html)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert cli_incidents(f"http://127.0.0.1:{server.server_address[1]}", None) == 1
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert "not JSON" in err and "\x1b" not in err
