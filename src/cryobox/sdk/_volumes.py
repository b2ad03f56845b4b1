"""Wire logic of volumes (``/v1/volumes``) without IO: requests and parsing, shared by both SDK flavours."""

from __future__ import annotations

import re
import urllib.parse

import httpx

from .. import models
from ..errors import InvalidArgument
from ._base import parse_model
from ._requests import ApiRequest

NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def _path(name: str) -> str:
    if not NAME.match(name):
        raise InvalidArgument(f"volume name {name[:80]!r} must be 1-64 of A-Z a-z 0-9 . _ -", details={"name": name})
    return f"/v1/volumes/{urllib.parse.quote(name, safe='')}"


def _size(size_mb: int) -> int:
    if isinstance(size_mb, bool) or not isinstance(size_mb, int) or not 16 <= size_mb <= (1 << 20):
        raise InvalidArgument(f"size_mb must be 16 to 1048576, not {size_mb!r}", details={"size_mb": size_mb})
    return size_mb


def create_request(name: str, size_mb: int) -> ApiRequest:
    _path(name)
    return ApiRequest("POST", "/v1/volumes", json={"name": name, "size_mb": _size(size_mb)})


def list_request() -> ApiRequest:
    return ApiRequest("GET", "/v1/volumes")


def get_request(name: str) -> ApiRequest:
    return ApiRequest("GET", _path(name))


def resize_request(name: str, size_mb: int) -> ApiRequest:
    return ApiRequest("PATCH", _path(name), json={"size_mb": _size(size_mb)})


def delete_request(name: str) -> ApiRequest:
    return ApiRequest("DELETE", _path(name))


def parse_volume(response: httpx.Response) -> models.Volume:
    return parse_model(models.Volume, response)


def parse_list(response: httpx.Response) -> list[models.Volume]:
    return parse_model(models.VolumeList, response).items
