"""The IO-free part of snapshots, forks and power state: parsing their responses (requests are in ``_requests``).

Kept apart from ``_base`` only for size; the result types are the frozen dataclasses in :mod:`cryobox.models`.
"""

from __future__ import annotations

import httpx
from pydantic import BaseModel, Field, RootModel

from .. import models
from ._base import parse_model


class _SnapshotList(BaseModel):
    snapshots: list[models.Snapshot]


class Forked(BaseModel):
    """``POST /v1/sandboxes/{id}/fork``."""

    parent_id: str
    sandbox: models.Sandbox


class ForkTreeBody(BaseModel):
    """``POST /v1/sandboxes/{id}/fork-tree`` (the SDK wraps ``children`` into sandbox objects)."""

    tree_id: str
    parent_id: str
    snapshot_id: str
    children: list[models.Sandbox]
    errors: list[models.ForkTreeError] = Field(default_factory=list)


class _Status(BaseModel):
    status: models.SandboxStatus


def parse_snapshot(response: httpx.Response) -> models.Snapshot:
    return parse_model(RootModel[models.Snapshot], response).root


def parse_snapshot_list(response: httpx.Response) -> list[models.Snapshot]:
    return parse_model(_SnapshotList, response).snapshots


def parse_fork(response: httpx.Response) -> Forked:
    return parse_model(Forked, response)


def parse_fork_tree(response: httpx.Response) -> ForkTreeBody:
    return parse_model(ForkTreeBody, response)


def parse_promote(response: httpx.Response) -> models.PromoteResult:
    return parse_model(RootModel[models.PromoteResult], response).root


def parse_status(response: httpx.Response) -> models.SandboxStatus:
    """``{"status": ...}``, the answer of ``hibernate`` and ``wake``."""
    return parse_model(_Status, response).status
