"""The one-process transport: :class:`InProcessAgent` calls an :class:`~.interface.Agent` implementation directly,
deep-copying every model, list and byte string that crosses (both ways), so the control plane and the agent
never share a mutable Python object, exactly as if the values had crossed HTTP. Errors cross as copies too (their
``details`` are not shared), raised ``from`` the agent's original for the traceback.

Its methods are derived from :data:`~.interface.OPERATIONS`: every operation is the same copy-call-copy (a stream
copies each item), so none is written here.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..errors import CryoboxError
from .interface import OPERATIONS, Agent
from .operations import Op, install


def _copy_error(exc: CryoboxError) -> CryoboxError:
    """A copy of ``exc`` with its own ``details`` (the original when its class cannot be rebuilt)."""
    try:
        copied = copy.copy(exc)
    except Exception:
        return exc
    copied.details = copy.deepcopy(exc.details)
    return copied


def _copy(value: Any) -> Any:
    """``value`` with nothing mutable shared: models deep-copied, byte strings as ``bytes``, containers rebuilt."""
    if isinstance(value, BaseModel):
        return value.model_copy(deep=True)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, list | tuple | dict | set):
        return copy.deepcopy(value)
    return value


async def _stream(start: Callable[[], AsyncIterator[Any]]) -> AsyncIterator[Any]:
    # the implementation is called at the first ``anext``, as the HTTP transport sends at the first ``anext``
    stream: AsyncIterator[Any] | None = None
    try:
        stream = start()
        async for item in stream:
            yield _copy(item)
    except CryoboxError as exc:
        raise _copy_error(exc) from exc
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


def _method(op: Op) -> Callable[..., Any]:
    """``op`` over a direct call of the implementation's method of the same name."""

    def arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        return op.call_args({name: _copy(value) for name, value in op.bind(args, kwargs).items()})

    if op.streamed:

        def stream(self: InProcessAgent, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            positional, keywords = arguments(args, kwargs)
            call = getattr(self.impl, op.name)
            return _stream(lambda: call(*positional, **keywords))

        return stream

    async def call(self: InProcessAgent, *args: Any, **kwargs: Any) -> Any:
        positional, keywords = arguments(args, kwargs)
        try:
            reply = await getattr(self.impl, op.name)(*positional, **keywords)
        except CryoboxError as exc:
            raise _copy_error(exc) from exc
        return _copy(reply)

    return call


@install(OPERATIONS, _method)
class InProcessAgent:
    """``Agent`` over direct calls to ``impl``; ``close()`` releases nothing of the agent's (it keeps running)."""

    def __init__(self, impl: Agent) -> None:
        self.impl = impl

    def __repr__(self) -> str:
        return f"InProcessAgent({self.impl!r})"

    async def close(self) -> None:
        """Nothing to release: the agent is not this object's to stop."""

    if TYPE_CHECKING:
        # the operations, installed by ``install`` above; typed as ``Agent``'s where the control plane holds one
        def __getattr__(self, name: str) -> Any: ...


__all__ = ["InProcessAgent"]
