"""Alertmanager delivers at least once: an alert is deduplicated only after the engine accepted it."""

from __future__ import annotations

import asyncio

import aiohttp

from sim.scheduler import SimulatedScheduler
from agent.remediation.engine import Executors

from tests.helpers import await_for
from tests.remediation_support import engine
from tests.test_webhook import TOKEN, alert, payload, serve


def test_an_alert_the_engine_refused_is_acted_on_when_alertmanager_retries(tmp_path):
    async def main():
        sched = SimulatedScheduler(["node01", "node02"])
        eng = engine(tmp_path, executors=Executors(scheduler=sched), max_drained_fraction=1.0)
        await eng.start()
        real_fire, refusals = eng.fire, []

        def refusing_fire(*args, **kwargs):
            if not refusals:
                refusals.append(args)
                raise RuntimeError("engine busy")
            return real_fire(*args, **kwargs)

        eng.fire = refusing_fire
        runner, url, reg = await serve(eng)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        xid = alert()
        xid["labels"]["detector"] = "gpu_lost"  # lands in the local detector's playbook (drain)
        async with aiohttp.ClientSession() as s:
            async def post():
                async with s.post(url + "/api/v1/alerts", json=payload(xid), headers=auth) as r:
                    return r.status, await r.json()
            status, body = await post()
            assert status == 503 and "not accepted" in body["error"]
            assert not eng.journal.alert_seen("fp1", "2026-01-01T00:00:00Z", "firing")
            status, body = await post()  # Alertmanager's retry
            assert status == 200 and body == {"accepted": 1, "duplicates": 0, "ignored": 0}
            await await_for(lambda: sched.nodes["node01"].drained, what="drained on the retry")
            status, body = await post()
            assert status == 200 and body == {"accepted": 0, "duplicates": 1, "ignored": 0}
        assert refusals and reg.get_sample_value("supernode_webhook_requests_total", {"result": "error"}) == 1
        await runner.cleanup()
        await eng.stop()
    asyncio.run(main())
