"""The states of a MicroVM and the guard that keeps its operations to the states they are valid in."""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

from ...errors import StateError

P = ParamSpec("P")
R = TypeVar("R")


class VmState(enum.Enum):
    CREATED = "created"
    INCOMING = "incoming"
    RUNNING = "running"
    PAUSED = "paused"
    SAVED = "saved"
    KILLED = "killed"

    @property
    def alive(self) -> bool:
        return self in (VmState.INCOMING, VmState.RUNNING, VmState.PAUSED, VmState.SAVED)


class Stateful(Protocol):
    state: VmState


S = TypeVar("S", bound=Stateful)


def require(
    *states: VmState,
) -> Callable[
    [Callable[Concatenate[S, P], Coroutine[Any, Any, R]]],
    Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
]:
    """Refuse the decorated operation (``StateError``, 409) unless the VM is in one of ``states``."""

    def decorate(
        fn: Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
    ) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
        @functools.wraps(fn)
        async def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
            if self.state not in states:
                raise StateError(
                    f"{fn.__name__} needs the VM in {'/'.join(s.value for s in states)}, it is {self.state.value}",
                    state=self.state.value,
                    required="|".join(s.value for s in states),
                )
            return await fn(self, *args, **kwargs)

        return cast("Callable[Concatenate[S, P], Coroutine[Any, Any, R]]", wrapper)

    return decorate
