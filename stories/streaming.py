"""Streaming responses that really stream under both WSGI and ASGI servers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, StreamingHttpResponse
from django.utils.http import content_disposition_header


async def async_chunks(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Pull a sync generator one chunk at a time from the request's sync thread, so an ASGI
    server streams it instead of collecting it in memory first (Django consumes a sync
    iterator whole under ASGI)."""
    done = object()
    while True:
        chunk = await sync_to_async(next, thread_sensitive=True)(chunks, done)
        if chunk is done:
            return
        yield chunk


def download(
    request: HttpRequest, chunks: Iterator[bytes], *, filename: str, content_type: str
) -> StreamingHttpResponse:
    response = StreamingHttpResponse(
        async_chunks(chunks) if isinstance(request, ASGIRequest) else chunks, content_type=content_type
    )
    response["Content-Disposition"] = content_disposition_header(True, filename)
    return response
