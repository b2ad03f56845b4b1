"""Sending one API call: the SDK's single boundary to httpx (transport errors, capacity retry, error mapping)."""

from __future__ import annotations

import httpx

from .._base import ClientConfig, RetryPlan, RetryPolicy, error_from_response, transport_error
from .._requests import ApiRequest


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
