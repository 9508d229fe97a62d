"""Property-based fuzzing of the two parsers that take outside input on the agent's side (issue 18): the config
loader and the Alertmanager webhook schema. Whatever the input, the answer is a value or one clean, short error:
ConfigError / WebhookError 4xx, never another exception.

Bounded to a few seconds in `make test`; HYPOTHESIS_PROFILE=fuzz (as `make fuzz` sets) runs many more examples.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.config import ConfigError, Identity, Inventory, load_config
from agent.remediation.webhook import TARGET_LABELS, WebhookError, handle_payload, parse_payload, targets_for

from tests.remediation_support import engine

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
pytestmark = pytest.mark.timeout(0 if DEEP else 120)  # the deep profile runs as long as it needs
FUZZ = settings(max_examples=5000 if DEEP else 150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

HOSTILE = ["a\x00b", "/" + "a" * 5000, "/dev/zero", "../../../../etc/passwd", "\x1b[2J", "9" * 5000, "²"]
scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40) |
           st.sampled_from(HOSTILE))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5) |
                           st.dictionaries(st.text(max_size=12), inner, max_size=5), max_leaves=30)

YAML_BITS = ["agent:", "  rack: r01", "  node: n1", "listen:", "  port: ", "&a", "*a", "<<: ", "- ", "[", "]", "{",
             "}", ": ", "'", '"', "\t", "\n", "!!python/object:os.system", "!!binary", "0x", "1e999", "~", "? ",
             "secrets:", "  admin_token: {file: /dev/zero}", "inventory:", "  cdus: [{name: c, profile: ../x}]"]
yaml_texts = st.lists(st.sampled_from(YAML_BITS) | st.text(max_size=8), max_size=40).map("".join)


def valid_config(tmp: Path) -> dict:
    (tmp / "admin.token").write_text("t0ken\n")
    return {"agent": {"rack": "r01", "node": "node01", "state_dir": str(tmp / "state")},
            "listen": {"address": "127.0.0.1", "port": 0},
            "secrets": {"admin_token": {"file": str(tmp / "admin.token")}}}


def assert_clean_load(tmp: Path, data: bytes) -> None:
    path = tmp / "agent.yaml"
    path.write_bytes(data)
    try:
        load_config(path)
    except ConfigError as exc:
        assert len(str(exc)) < 4000, str(exc)[:500]


@FUZZ
@given(data=st.binary(max_size=600) | yaml_texts.map(str.encode))
def test_config_loader_never_raises_anything_but_config_error(data):
    with tempfile.TemporaryDirectory() as tmp:
        assert_clean_load(Path(tmp), data)


@FUZZ
@given(section=st.sampled_from(["agent", "listen", "inventory", "sources", "secrets", "auth", "remediation"]),
       key=st.text(min_size=1, max_size=20) | st.sampled_from(["port", "mode", "rack", "cdus", "pdus", "gpus",
                                                               "admin_tokens", "max_connections", "profile",
                                                               "playbook_dir", "state_dir", "admin_token"]),
       value=json_values)
def test_config_loader_on_mutated_valid_configs(section, key, value):
    with tempfile.TemporaryDirectory() as tmp:
        cfg = valid_config(Path(tmp))
        target = cfg.setdefault(section, {})
        if isinstance(target, dict):
            target[key] = value
        assert_clean_load(Path(tmp), yaml.safe_dump(cfg).encode())


IDENTITY = Identity(rack="r01", node="node01")
INVENTORY = Inventory(nodes=["node01", "node02"], gpus={"count": 4},
                      leak_zones=[{"name": "zone-a", "nodes": ["node01"]}])
label_values = st.sampled_from(["node01", "node02", "0", "3", "17", "zone-a", "²", "٣", "-1", "r01", ""]) | \
    st.text(max_size=12)
labels = st.dictionaries(st.sampled_from(list(TARGET_LABELS) + ["alertname", "rack", "severity", "detector"]) |
                         st.text(max_size=8), label_values, max_size=8)
alerts = st.fixed_dictionaries({"status": st.sampled_from(["firing", "resolved", "x"]), "labels": labels,
                                "startsAt": st.text(max_size=5)},
                               optional={"annotations": st.dictionaries(st.text(max_size=5), st.text(max_size=5)),
                                         "fingerprint": st.text(max_size=8)})
payloads = st.fixed_dictionaries({"version": st.sampled_from(["4", "3", 4]), "status": st.sampled_from(["firing", "x"]),
                                  "alerts": st.lists(alerts, max_size=4)},
                                 optional={"extra": json_values, "truncatedAlerts": st.integers()})


@FUZZ
@given(body=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()) |
       payloads.map(lambda v: json.dumps(v).encode()))
def test_webhook_schema_answers_a_value_or_a_4xx(body):
    try:
        payload = parse_payload(body)
    except WebhookError as exc:
        assert 400 <= exc.status < 500
        return
    for alert in payload.alerts:
        try:
            targets = targets_for(alert, IDENTITY, INVENTORY)
        except WebhookError as exc:
            assert exc.status == 422
            continue
        for key in ("gpu", "link"):
            if key in targets:
                assert targets[key].isascii() and targets[key].isdigit() and int(targets[key]) < 18
        if "node" in targets:
            assert targets["node"] in ("node01", "node02")


UNKNOWN_NAMES = ["NotADetector", "gpu_xid", "leak ", ""]


def payloads_naming(names: list[str]) -> st.SearchStrategy[dict]:
    """Alertmanager payloads whose alerts name real detectors and playbook alertnames (and a few near misses):
    with names drawn from `label_values` alone no alert would ever reach a detector."""
    name = st.sampled_from(names + UNKNOWN_NAMES) | st.text(max_size=8)
    target = st.fixed_dictionaries({}, optional={"node": st.sampled_from(["node01", "node02", "node9", ""]),
                                                 "gpu": st.sampled_from(["0", "3", "17", "٣"]),
                                                 "zone": st.sampled_from(["zone-a", "zone-z"])})
    alert = st.builds(lambda n, d, t, s, sev: {"status": s, "startsAt": "2026-01-01T00:00:00Z",
                                               "labels": {"alertname": n, **({"detector": d} if d else {}), **t,
                                                          "severity": sev}},
                      name, st.none() | name, target, st.sampled_from(["firing", "firing", "resolved", "x"]),
                      st.sampled_from(["critical", "warning", "bogus"]))
    return st.fixed_dictionaries({"version": st.just("4"), "status": st.just("firing"),
                                  "alerts": st.lists(alert, min_size=1, max_size=4)})


def test_webhook_handler_never_grows_state_from_fuzzed_payloads(tmp_path):
    """The whole handler on a live engine: whatever comes in, only known detectors become incidents. The payloads
    name real detectors, so alerts do reach them (incidents open) while unknown names are ignored, and a payload
    the handler refuses is refused with a 4xx (both seen, not assumed)."""
    async def main():
        eng = engine(tmp_path, mode="observe")
        await eng.start()
        known = {t for t in eng.detectors.trackers} | {b.trigger.alertname for b in eng.playbooks} | \
            {b.trigger.detector for b in eng.playbooks}
        known.discard(None)
        refused: list[int] = []
        answers: list[dict] = []
        loop = asyncio.get_running_loop()

        async def handle(body: bytes) -> dict:  # on the engine's loop, as the HTTP route calls it
            return handle_payload(eng, body)

        @FUZZ
        @given(p=payloads_naming(sorted(known)))
        def run(p):
            try:
                answers.append(asyncio.run_coroutine_threadsafe(handle(json.dumps(p).encode()), loop).result(30))
            except WebhookError as exc:
                refused.append(exc.status)
                assert 400 <= exc.status < 500, exc

        await asyncio.to_thread(run)
        opened = eng.incidents.all()
        assert opened, "no fuzzed alert reached a detector"
        assert {i.detector for i in opened} <= known
        assert sum(a["accepted"] for a in answers) > 0 and sum(a["ignored"] for a in answers) > 0, answers[:5]
        assert refused and all(400 <= s < 500 for s in refused)
        await eng.stop()
    asyncio.run(main())
