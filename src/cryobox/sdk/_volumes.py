"""Wire logic of volumes (``/v1/volumes``) without IO: requests and parsing, shared by both SDK flavours."""

from __future__ import annotations

import re
import urllib.parse

import httpx

from .. import models
from ..errors import InvalidArgument
from ..models.volumes import NAME_PATTERN
from ._base import parse_model
from ._requests import ApiRequest

NAME = re.compile(NAME_PATTERN)


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


def restore_request(name: str) -> ApiRequest:
    return ApiRequest("POST", _path(name) + "/restore")


def _in_volume(path: str) -> str:
    if not path or "\0" in path or len(path) > 4096:
        raise InvalidArgument("a path in a volume is 1-4096 characters without NUL", details={"path": path[:200]})
    return path if path.startswith("/") else f"/{path}"


def read_file_request(name: str, path: str) -> ApiRequest:
    return ApiRequest("GET", f"{_path(name)}/files", params={"path": _in_volume(path)})


def write_file_request(name: str, path: str, data: bytes | str, overwrite: bool) -> ApiRequest:
    body = data.encode() if isinstance(data, str) else bytes(data)
    params = {"path": _in_volume(path), "overwrite": "true" if overwrite else "false"}
    return ApiRequest("PUT", f"{_path(name)}/files", params=params, content=body)


def remove_request(name: str, path: str) -> ApiRequest:
    return ApiRequest("DELETE", f"{_path(name)}/files", params={"path": _in_volume(path)})


def list_files_request(name: str, path: str, depth: int) -> ApiRequest:
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 64:
        raise InvalidArgument(f"depth must be 1 to 64, not {depth!r}", details={"depth": depth})
    return ApiRequest("GET", f"{_path(name)}/entries", params={"path": _in_volume(path), "depth": str(depth)})


def stat_request(name: str, path: str) -> ApiRequest:
    return ApiRequest("GET", f"{_path(name)}/stat", params={"path": _in_volume(path)})


def make_dir_request(name: str, path: str, parents: bool) -> ApiRequest:
    params = {"path": _in_volume(path), "parents": "true" if parents else "false"}
    return ApiRequest("POST", f"{_path(name)}/dirs", params=params)


def parse_entry(response: httpx.Response) -> models.VolumeEntry:
    return parse_model(models.VolumeEntry, response)


def parse_entries(response: httpx.Response) -> list[models.VolumeEntry]:
    return parse_model(models.VolumeEntryList, response).items


def parse_volume(response: httpx.Response) -> models.Volume:
    return parse_model(models.Volume, response)


def parse_restored(response: httpx.Response) -> models.VolumeRestored:
    return parse_model(models.VolumeRestored, response)


def parse_list(response: httpx.Response) -> list[models.Volume]:
    return parse_model(models.VolumeList, response).items
