"""Sending one API call: the SDK's single boundary to httpx (transport errors, capacity retry, error mapping)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import httpx

from .. import _sse
from .._base import (
    ClientConfig,
    RetryPlan,
    RetryPolicy,
    StreamEvent,
    error_from_response,
    raise_for_error,
    transport_error,
)
from .._requests import ApiRequest
from .._sse import OutputCallback


def open_client(config: ClientConfig) -> httpx.AsyncClient:
    return httpx.AsyncClient(**config.client_options())


async def send(http: httpx.AsyncClient, request: ApiRequest, retry: RetryPolicy) -> httpx.Response:
    """Send ``request`` and return its successful response.

    Capacity refusals are retried per ``retry`` when ``request.retry_capacity`` is set; nothing else is retried.

    :raises CryoboxError: the mapped error of the (last) error response, or a translated transport failure.
    """
    plan = RetryPlan(retry) if request.retry_capacity else None
    while True:
        try:
            response = await http.request(request.method, request.path, **request.send_options())
        except httpx.TransportError as err:
            raise transport_error(err, str(http.base_url)) from err
        error = error_from_response(response)
        if error is None:
            return response
        delay = plan.next_delay(response) if plan is not None else None
        if delay is None:
            raise error
        await retry.async_sleep(delay)


async def _lines_then_end(response: httpx.Response) -> AsyncIterator[str]:
    """The response's lines, then one ``""`` that flushes an event whose final blank line never came."""
    async for line in response.aiter_lines():  # noqa: UP028 (in the generated sync twin, `yield from` would do)
        yield line
    yield ""


async def stream_lines(http: httpx.AsyncClient, request: ApiRequest) -> AsyncGenerator[str]:
    """The lines of a streamed response (an event stream), then one ``""`` that flushes an event whose final blank
    line never came. Close the iterator (``contextlib.aclosing``) to release the connection early.

    :raises CryoboxError: the mapped error of an error response, or a translated transport failure.
    """
    try:
        async with http.stream(request.method, request.path, **request.send_options()) as response:
            if response.status_code >= 400:
                await response.aread()
                raise_for_error(response)
            async for line in _lines_then_end(response):  # noqa: UP028 (in the generated sync twin, `yield from` would do)
                yield line
    except httpx.TransportError as err:
        raise transport_error(err, str(http.base_url)) from err


async def output_stream(
    http: httpx.AsyncClient,
    request: ApiRequest,
    on_stdout: OutputCallback | None,
    on_stderr: OutputCallback | None,
    ended_early: Callable[[], Exception],
) -> AsyncGenerator[StreamEvent]:
    """The events of an exec-style output stream (``exec/stream``, a process's ``stream``) up to its ``exit``
    event, each output chunk handed to its callback too.

    :raises CryoboxError: an ``error`` event (mapped by its code), or ``ended_early()`` for a stream that ended
        without an ``exit`` event.
    """
    decoder = _sse.ExecStreamDecoder()
    async with contextlib.aclosing(stream_lines(http, request)) as lines:
        async for line in lines:
            event = decoder.feed(line)
            if event is None:
                continue
            _sse.notify(event, on_stdout, on_stderr)
            yield event
            if event.kind == "exit":
                return
    raise ended_early()
