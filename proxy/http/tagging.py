"""Writing a call's id into its request body, for upstreams that read it there (``TagsRequests``).

The body is read whole (it is the small JSON of a generation request) up to a limit, tagged, and
sent with its new length. A body that cannot be tagged (not a JSON object, or over the limit)
goes on untouched, and the caller logs why: the call still relays, only its explicit cancel
cannot find it upstream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

TAG_LIMIT = 8 * 1024 * 1024  # bytes read to tag a body when --max-body-size sets no lower limit


async def tag_body(
    chunks: AsyncIterator[bytes],
    tag: Callable[[bytes, str], bytes],
    request_id: str,
    limit: int,
) -> tuple[bytes | AsyncIterator[bytes], str | None]:
    """(the body to send, why it was not tagged or None)."""
    buffered = bytearray()
    async for chunk in chunks:
        buffered += chunk
        if len(buffered) > limit:
            return _replay(bytes(buffered), chunks), f"the body is over {limit} bytes"
    try:
        return tag(bytes(buffered), request_id), None
    except ValueError as exc:
        return bytes(buffered), f"the body is {exc}"


async def _replay(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield head
    async for chunk in rest:
        yield chunk
