"""A cancel that finds its pod: hangup's cancel call asked of every member of a pool at once.

Behind a front door that holds a call without passing a hang-up on (an application server,
LiteLLM without ``cancel_on_disconnect``), a hangup proxy at the edge still sees its client leave
and knows the id it sent on, but not which pod holds the call. ``--cancel-pool`` names the pods:
base URLs (``http://host:port``), each host resolved to every address it has (a Kubernetes
headless Service resolves to every ready pod), resolved again once ``--cancel-pool-refresh``
seconds have passed, so pods that come and go are followed. A cancel asks every member at once (at
most ``--cancel-pool-max``) and is done as soon as one answers that it held the call (``ok``, or
``finished``: it had ended); the others answer ``not_found`` and keep a tombstone for the id,
which expires as it always does. Counted once, as any cancel
(``hangup_proxy_cancel_calls_total``), with the members asked
(``hangup_proxy_cancel_pool_members``).

If no member held the call and one could not be asked (refused, timed out, answered 5xx), the
attempt failed, and the canceller asks the whole pool again (that member may be the one); if every
member answered ``not_found``, the id was nowhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from hangup_contract.cancel_labels import Reason
from proxy.cancel.http import HangupCancel, HttpCancelAdapter
from proxy.errors import CancelAttemptFailed
from proxy.labels import CancelResult

log = logging.getLogger("hangup.proxy.cancel")

HELD = (CancelResult.OK, CancelResult.FINISHED)


class PoolCancelAdapter:
    """A ``CancelAdapter`` asking every member of ``urls`` (resolved) for each cancel."""

    name = "hangup"
    calls_upstream = True

    def __init__(
        self,
        urls: Sequence[str],
        token: str | None,
        attempt_timeout: float,
        *,
        refresh: float,
        max_members: int,
        asked: Callable[[int], None] = lambda members: None,
    ) -> None:
        self._urls = tuple(urls)
        self._token = token
        self._timeout = attempt_timeout
        self._refresh = refresh
        self._max = max_members
        self._asked = asked
        self._members: dict[str, HttpCancelAdapter] = {}
        self._resolved_at: float | None = None
        self._resolving = asyncio.Lock()  # one resolution at a time; cancels meanwhile wait for it
        self._stray: set[asyncio.Task[CancelResult]] = set()

    async def cancel(self, request_id: str, reason: Reason) -> CancelResult:
        members = await self._current()
        if not members:
            raise CancelAttemptFailed(f"the cancel pool {','.join(self._urls)} has no member")
        self._asked(len(members))
        attempts = [asyncio.ensure_future(m.cancel(request_id, reason)) for m in members]
        answers: list[CancelResult] = []
        failed: list[str] = []
        pending: set[asyncio.Task[CancelResult]] = set(attempts)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for attempt in done:
                    try:
                        answer = attempt.result()
                    except CancelAttemptFailed as exc:
                        failed.append(str(exc))
                        continue
                    if answer in HELD:
                        return answer
                    answers.append(answer)
        finally:
            self._leave(pending)  # the members still answering held nothing we wait for
        if failed:
            raise CancelAttemptFailed(f"no member held it; {len(failed)} not asked: {failed[0]}")
        return CancelResult.ERROR if CancelResult.ERROR in answers else CancelResult.NOT_FOUND

    def _leave(self, pending: set[asyncio.Task[CancelResult]]) -> None:
        """Let the attempts still in flight end by themselves (each is bounded by the attempt
        timeout), their answers read and dropped."""
        for attempt in pending:
            self._stray.add(attempt)
            attempt.add_done_callback(self._dropped)

    def _dropped(self, attempt: asyncio.Task[CancelResult]) -> None:
        self._stray.discard(attempt)
        if not attempt.cancelled():
            attempt.exception()  # read: a failed stray attempt is no error of the call

    async def _current(self) -> list[HttpCancelAdapter]:
        """The members, resolved again once ``refresh`` seconds have passed (a cancel that
        arrives during a resolution waits for it, rather than asking the members before it)."""
        async with self._resolving:
            now = time.monotonic()
            if self._resolved_at is None or now - self._resolved_at >= self._refresh:
                self._resolved_at = now
                try:
                    await self._resolve()
                except OSError as exc:  # keep the members known: DNS may come back
                    urls = ",".join(self._urls)
                    log.warning("cannot resolve the cancel pool %s: %s", urls, exc)
        return list(self._members.values())[: self._max]

    async def _resolve(self) -> None:
        found: list[str] = []
        for url in self._urls:
            found += [u for u in await resolve(url) if u not in found]
        for gone in set(self._members) - set(found):
            await self._members.pop(gone).close()
        for url in found:
            if url not in self._members:
                adapter = HttpCancelAdapter(HangupCancel(), url, self._token, self._timeout)
                self._members[url] = adapter

    async def close(self) -> None:
        for attempt in list(self._stray):
            attempt.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._stray, return_exceptions=True)
        for member in self._members.values():
            await member.close()
        self._members.clear()


async def resolve(url: str) -> list[str]:
    """``url`` (``http://host:port[/prefix]``) once per address its host resolves to, in the
    order the resolver gives them; an address literal as it is."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port
    assert host is not None and port is not None  # checked when the flag was read
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return [url]
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    urls: list[str] = []
    for _, _, _, _, address in infos:
        ip = str(address[0])
        shown = f"[{ip}]" if ":" in ip else ip
        member = f"http://{shown}:{port}{parts.path}"
        if member not in urls:
            urls.append(member)
    return urls
