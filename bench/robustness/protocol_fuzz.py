"""Benchmark: the long run of the protocol fuzz (HTTP/1.1: ``bench/harness/http_fuzz.py``; gRPC
messages: ``bench/harness/grpc_fuzz.py``; a short run of each is in ``make test``) against the
proxy and the gateway, real processes, 32 cases at a time. Prints the answers by status and every
finding (a 5xx or a gRPC status a client cannot act on, a malformed status line, a process that
died, something left in flight).

Run: ``.venv/bin/python -m bench.robustness.protocol_fuzz`` (``--cases 20000 --grpc-cases 20000
--seed 1``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import tempfile
import time
from pathlib import Path

import aiohttp
import grpc

from bench.base.waiting import wait_until
from bench.harness import grpc_fuzz
from bench.harness.http_fuzz import cases, run_all, send
from bench.harness.stack import in_flight, running_stack

CONCURRENCY = 32


async def run_grpc(
    address: str, fuzz: list[grpc_fuzz.Case]
) -> list[tuple[grpc_fuzz.Case, grpc_fuzz.Answer]]:
    async with grpc.aio.insecure_channel(address) as channel:
        return await run_all(lambda case: grpc_fuzz.send(channel, case), fuzz, CONCURRENCY)


async def left_in_flight(gateway_url: str) -> int:
    """Calls still in flight on the gateway once it has had 10 s to end them."""
    async with aiohttp.ClientSession() as session:

        async def idle() -> bool:
            return not await in_flight(session, gateway_url)

        with contextlib.suppress(AssertionError):
            await wait_until(idle, within=10, what="nothing in flight")
        return len(await in_flight(session, gateway_url))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=20000)
    parser.add_argument("--grpc-cases", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hangup-fuzz-") as tmp, running_stack(
        Path(tmp), [], ["--header-timeout", "2"]
    ) as stack:  # fmt: skip
        for name, process in (("proxy", stack.proxy), ("gateway", stack.gateway)):
            started = time.monotonic()
            to_process = functools.partial(send, process.listeners["http"])
            results = asyncio.run(run_all(to_process, cases(args.seed, args.cases), CONCURRENCY))
            took = time.monotonic() - started
            statuses = collections.Counter(a.status for _, a in results)
            findings = [c.mutation for c, a in results if a.status and a.status >= 500]
            alive = stack.proxy.popen.poll() is None and stack.gateway.popen.poll() is None
            left = asyncio.run(left_in_flight(stack.gateway_url))
            shown = ", ".join(f"{s or 'closed'}: {n}" for s, n in sorted(
                statuses.items(), key=lambda kv: kv[0] or 0))  # fmt: skip
            print(f"{name}: {len(results)} cases in {took:.0f} s; {shown}; 5xx: {len(findings)};"
                  f" both alive: {alive}; left in flight: {left}", flush=True)  # fmt: skip
            for mutation in findings[:10]:
                print(f"  finding: {mutation}", flush=True)
        for name, process in (("proxy", stack.proxy), ("gateway", stack.gateway)):
            started = time.monotonic()
            fuzz = grpc_fuzz.cases(args.seed, args.grpc_cases)
            answers = asyncio.run(run_grpc(process.listeners["grpc"], fuzz))
            took = time.monotonic() - started
            codes = collections.Counter(a.code for _, a in answers)
            found = [(c.mutation, f) for c, a in answers for f in a.findings()]
            alive = stack.proxy.popen.poll() is None and stack.gateway.popen.poll() is None
            left = asyncio.run(left_in_flight(stack.gateway_url))
            shown = ", ".join(f"{code}: {n}" for code, n in codes.most_common())
            print(f"{name} gRPC: {len(answers)} cases in {took:.0f} s; {shown};"
                  f" findings: {len(found)}; both alive: {alive}; left in flight: {left}",
                  flush=True)  # fmt: skip
            for mutation, finding in found[:10]:
                print(f"  finding: {mutation}: {finding[:200]}", flush=True)


if __name__ == "__main__":
    main()
