"""Which sandbox rows this process's own writes changed, told after each commit: what a cache of rows
(:mod:`cryobox.server.control.routecache`) forgets. Every write to a sandbox row goes through a writing session
of :class:`~.db.Database` (ORM objects flushed, or ``UPDATE``/``DELETE`` statements on ``m.Sandbox``); the ids
are collected as the session flushes or executes and reported once it commits (nothing when it rolls back).
A statement whose rows cannot be told from its ``WHERE`` (``status = 'lost' WHERE host IN …``) reports ``None``:
any row may have changed. Another process's writes are not seen here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session, UOWTransaction
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import BinaryExpression, BindParameter, BooleanClauseList, ColumnElement

from . import models as m
from .db import Database

Changed = Callable[[frozenset[str] | None], None]
"""Told the ids of the sandbox rows a commit changed, or ``None`` when they cannot be told."""

_KEY = "cryobox_changed_sandboxes"
_ALL = "*"


def _pending(session: Session) -> set[str]:
    changed: set[str] = session.info.setdefault(_KEY, set())
    return changed


def _is_id(column: Any) -> bool:
    """``m.Sandbox.id``, as the ORM hands it over (an annotated copy of the table's column)."""
    return getattr(column, "table", None) is m.Sandbox.__table__ and getattr(column, "name", None) == "id"


def _ids_named(where: ColumnElement[Any] | None) -> set[str] | None:
    """The sandbox ids a ``WHERE`` limits its rows to (``id = x``, ``id IN (…)``, either inside an ``AND``), or
    ``None``."""
    clauses: Iterable[Any] = (
        where.clauses if isinstance(where, BooleanClauseList) and where.operator is operators.and_ else (where,)
    )
    for clause in clauses:
        if not isinstance(clause, BinaryExpression) or not _is_id(clause.left):
            continue
        right = clause.right
        if not isinstance(right, BindParameter):
            continue
        if clause.operator is operators.eq:
            return {str(right.value)}
        if clause.operator is operators.in_op and isinstance(right.value, list | tuple | set | frozenset):
            return {str(v) for v in right.value}
    return None


def watch_sandboxes(db: Database, changed: Changed) -> Callable[[], None]:
    """Call ``changed`` after every commit of ``db`` that changed sandbox rows; returns what stops it."""

    def after_flush(session: Session, _: UOWTransaction) -> None:
        for obj in (*session.new, *session.dirty, *session.deleted):
            if isinstance(obj, m.Sandbox):
                _pending(session).add(obj.id)

    def on_execute(state: ORMExecuteState) -> None:
        if not (state.is_update or state.is_delete):
            return
        if not any(mapper.class_ is m.Sandbox for mapper in state.all_mappers):
            return
        ids = _ids_named(getattr(state.statement, "whereclause", None))
        _pending(state.session).update(ids if ids is not None else {_ALL})

    def after_commit(session: Session) -> None:
        ids = session.info.pop(_KEY, None)
        if ids:
            changed(None if _ALL in ids else frozenset(ids))

    def after_rollback(session: Session) -> None:
        session.info.pop(_KEY, None)

    hooks: list[tuple[str, Callable[..., None]]] = [
        ("after_flush", after_flush),
        ("do_orm_execute", on_execute),
        ("after_commit", after_commit),
        ("after_soft_rollback", lambda session, _: after_rollback(session)),
    ]
    for name, fn in hooks:
        event.listen(db.writer, name, fn)

    def stop() -> None:
        while hooks:
            name, fn = hooks.pop()
            event.remove(db.writer, name, fn)

    return stop


__all__ = ["Changed", "watch_sandboxes"]
