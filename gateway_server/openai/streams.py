"""Running several engine requests of one call side by side (``n > 1`` choices)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import TypeVar, cast

T = TypeVar("T")

_DONE = object()


async def merge(streams: Sequence[AsyncGenerator[T, None]]) -> AsyncGenerator[tuple[int, T], None]:
    """Items of every stream as ``(stream index, item)``, in the order they arrive.

    The first stream that fails ends the merge with its exception. Leaving early (closing this
    generator, or cancelling the task that iterates it) cancels every stream and waits for them:
    each one runs its own cleanup (for engine requests: the abort) before this returns.
    """
    if len(streams) == 1:
        async with aclosing(streams[0]) as only:
            async for item in only:
                yield 0, item
        return
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncGenerator[T, None]) -> None:
        try:
            async with aclosing(stream) as s:
                async for item in s:
                    queue.put_nowait((index, item))
        except Exception as exc:
            queue.put_nowait((index, exc))
        else:
            queue.put_nowait((index, _DONE))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, entry = await queue.get()
            if entry is _DONE:
                remaining -= 1
            elif isinstance(entry, Exception):
                raise entry
            else:
                yield index, cast(T, entry)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
