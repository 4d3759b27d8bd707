"""Jobs on the gateway (issue 66, ``hangup_contract.jobs``): a group of calls cancelled by one
call, across API processes too; a batch of ids, each answered; vLLM PR 55521's paths; a cancel
by the answer's own id; the group in ``GET /v2/requests``; the bounds on groups."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from gateway_server.engine.sim.config import SimConfig
from tests.support.gateway import LONG, MODEL, Gateway, running_api_processes, running_gateway

TOKEN = "jobs-token"
FAST = SimConfig(step_base_s=0.005)


async def start(
    gw: Gateway, rid: str, *, group: str | None = None, body_group: str | None = None
) -> aiohttp.ClientResponse:
    """A streaming completion that outlives the test, its first event read."""
    body: dict[str, Any] = {"model": MODEL, "prompt": "x", "max_tokens": LONG, "stream": True}
    if body_group is not None:
        body["metadata"] = {"hangup_group": body_group}
    headers = {"X-Request-Id": rid} | ({"X-Hangup-Group": group} if group else {})
    resp = await gw.session.post(f"{gw.url}/v1/completions", json=body, headers=headers)
    assert resp.status == 200, await resp.text()
    await resp.content.readline()
    return resp


async def post(
    gw: Gateway, path: str, body: object = None, method: str = "POST", auth: bool = True
) -> tuple[int, dict[str, Any]]:
    headers = gw.auth() if auth else {}
    async with gw.session.request(method, gw.url + path, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def ended_cancelled(resp: aiohttp.ClientResponse) -> bool:
    """Whether the stream ends with the cancel's error event (no ``[DONE]``)."""
    rest = await asyncio.wait_for(resp.content.read(), 10)
    resp.release()
    return b"request cancelled (explicit)" in rest and b"[DONE]" not in rest


async def test_one_call_ends_every_call_of_a_group_and_only_those() -> None:
    async with running_gateway(sim=FAST, token=TOKEN) as gw:
        a = await start(gw, "a-1", group="job-1")
        b = await start(gw, "b-1", body_group="job-1")  # the body's metadata.hangup_group
        other = await start(gw, "c-1", group="job-2")
        listed = await gw.in_flight()
        assert {r: listed[r]["group"] for r in listed} == {
            "a-1": "job-1", "b-1": "job-1", "c-1": "job-2"
        }  # fmt: skip
        status, only = await post(gw, "/v2/requests?group=job-1", method="GET")
        assert status == 200 and {r["request_id"] for r in only["requests"]} == {"a-1", "b-1"}
        assert (await post(gw, "/v2/groups/job-1/cancel", auth=False))[0] == 401
        status, answer = await post(gw, "/v2/groups/job-1/cancel")
        assert status == 200, answer
        assert answer["group"] == "job-1" and answer["status"] == "cancelled"
        assert sorted(answer["cancelled_request_ids"]) == ["a-1", "b-1"]
        assert {(e["request_id"], e["state"], e["phase"]) for e in answer["results"]} == {
            ("a-1", "cancelled", "decode"), ("b-1", "cancelled", "decode")
        }  # fmt: skip
        assert await ended_cancelled(a) and await ended_cancelled(b)
        assert set(await gw.in_flight()) == {"c-1"}  # another job's call runs on
        other.close()
        # A call of the job still on its way is refused, as a cancel that beat its call.
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        async with gw.session.post(
            gw.url + "/v1/completions", json=body, headers={"X-Hangup-Group": "job-1"}
        ) as late:
            assert late.status == 499, await late.text()
        assert gw.metric("hangup_gateway_cancel_api_calls_total", kind="group") == 1
        assert (
            gw.metric("hangup_gateway_cancel_api_ids_total", kind="group", state="cancelled") == 2
        )


async def test_a_group_spread_over_api_processes_ends_with_one_call(tmp_path: Path) -> None:
    async with running_api_processes(tmp_path, 2, sim=FAST) as (first, second):
        streams = [await start(gw, f"{gw.url[-5:]}-{i}", group="rollout-7")
                   for gw in (first, second) for i in range(2)]  # fmt: skip
        status, answer = await post(second, "/v2/groups/rollout-7/cancel")
        assert status == 200, answer
        assert len(answer["cancelled_request_ids"]) == 4
        assert all([await ended_cancelled(s) for s in streams])
        assert await first.in_flight() == {}
        async with first.session.post(
            second.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2},
            headers={"X-Hangup-Group": "rollout-7"},
        ) as late:  # fmt: skip
            assert late.status == 499  # the group is buried in every process


async def test_a_batch_answers_each_id_by_what_it_found() -> None:
    async with running_gateway(sim=FAST, token=TOKEN, max_batch_ids=4) as gw:
        live = await start(gw, "live-1")
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        async with gw.session.post(
            gw.url + "/v1/completions", json=body, headers={"X-Request-Id": "done-1"}
        ) as done:
            assert done.status == 200
        ids = ["live-1", "done-1", "never-1", "live-1"]
        status, answer = await post(gw, "/v2/requests/cancel", {"request_ids": ids})
        assert status == 200, answer
        assert [(e["request_id"], e["state"]) for e in answer["results"]] == [
            ("live-1", "cancelled"), ("done-1", "finished"), ("never-1", "not_found")
        ]  # fmt: skip
        assert answer["cancelled_request_ids"] == ["live-1"]
        assert await ended_cancelled(live)
        too_many = {"request_ids": [f"x{i}" for i in range(5)]}
        status, refused = await post(gw, "/v2/requests/cancel", too_many)
        assert status == 400 and "at most 4" in refused["error"]
        assert (await post(gw, "/v2/requests/cancel", {"request_ids": ["a b"]}))[0] == 400
        assert (await post(gw, "/v2/requests/cancel", {"request_ids": "a"}))[0] == 400
        assert (await post(gw, "/v2/requests/cancel", {"request_ids": []}, auth=False))[0] == 401
        assert (
            gw.metric("hangup_gateway_cancel_api_ids_total", kind="batch", state="not_found") == 1
        )


async def test_the_paths_of_vllm_pr_55521() -> None:
    async with running_gateway(sim=FAST, token=TOKEN) as gw:
        one, two, three = [await start(gw, r) for r in ("p-1", "p-2", "p-3")]
        assert (await post(gw, "/v1/requests/p-1/cancel", auth=False))[0] == 401
        status, answer = await post(gw, "/v1/requests/p-1/cancel")
        assert status == 200 and answer["status"] == "cancelled" and answer["request_id"] == "p-1"
        status, answer = await post(gw, "/v1/requests/p-2", method="DELETE")
        assert status == 200 and answer["status"] == "cancelled"
        status, answer = await post(gw, "/v1/requests/p-2", method="DELETE")
        assert status == 404 and answer["error"]["type"] == "not_found_error"  # ended: the PR's 404
        assert (await post(gw, "/v1/requests/nobody/cancel"))[0] == 404
        status, answer = await post(gw, "/v1/requests/cancel", {"request_ids": ["p-3", "zz"]})
        assert status == 200 and answer["cancelled_request_ids"] == ["p-3"]
        assert all([await ended_cancelled(s) for s in (one, two, three)])


async def test_a_cancel_by_the_answers_own_id_ends_the_stream() -> None:
    """A streaming client that set no ``X-Request-Id`` knows its call by the ``id`` of its first
    event (Rapid-MLX issue 2342): a cancel by that id ends it."""
    async with running_gateway(sim=FAST, token=TOKEN) as gw:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                "max_tokens": LONG, "stream": True}  # fmt: skip
        resp = await gw.session.post(gw.url + "/v1/chat/completions", json=body)
        first = json.loads((await resp.content.readline()).decode()[6:])
        answer_id = first["id"]
        assert answer_id.startswith("chatcmpl-")
        status, answer = await post(gw, f"/v2/requests/{answer_id}/cancel")
        assert status == 200 and answer["state"] == "cancelled", answer
        assert answer["request_id"] == answer_id
        assert await ended_cancelled(resp)
        assert (await post(gw, f"/v1/requests/{answer_id}/cancel"))[0] == 404  # ended now


async def test_groups_are_bounded_and_held_to_the_id_rule() -> None:
    async with running_gateway(sim=FAST, token=TOKEN, max_groups=1, max_group_calls=1) as gw:
        held = await start(gw, "g-1", group="only")
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        for headers, status in (
            ({"X-Hangup-Group": "only"}, 429),  # a second call of the group
            ({"X-Hangup-Group": "another"}, 429),  # a second group
            ({"X-Hangup-Group": "a b"}, 400),
            ({"X-Hangup-Group": "x" * 129}, 400),
        ):
            async with gw.session.post(gw.url + "/v1/completions", json=body, headers=headers) as r:
                assert r.status == status, (headers, await r.text())
        clash = body | {"metadata": {"hangup_group": "two"}}
        async with gw.session.post(
            gw.url + "/v1/completions", json=clash, headers={"X-Hangup-Group": "one"}
        ) as r:
            assert r.status == 400 and "two groups" in await r.text()
        assert (await post(gw, "/v2/groups/a%20b/cancel"))[0] == 400
        held.close()


async def test_a_group_cancel_frees_both_legs_of_each_disaggregated_call() -> None:
    async with running_gateway(
        sim=FAST, token=TOKEN, workers=2, worker_roles="prefill,decode"
    ) as gw:
        streams = [await start(gw, f"pd-{i}", group="pd-job") for i in range(2)]
        status, answer = await post(gw, "/v2/groups/pd-job/cancel")
        assert status == 200, answer
        for entry in answer["results"]:
            assert entry["state"] == "cancelled"
            assert set(entry["legs"]) == {"prefill", "decode"}, entry
        assert all([await ended_cancelled(s) for s in streams])
