"""``AsyncSandbox``: the asynchronous SDK object for one sandbox.

The SDK's IO is written once, asynchronously, in ``sdk/_async``; ``scripts/unasync.py`` generates ``sdk/_sync``
from it. Wire logic (request building, parsing, error mapping, retry planning) lives in ``sdk/_base``.

Example::

    from cryobox import AsyncSandbox

    async with await AsyncSandbox.create(template="base") as sbx:
        await sbx.filesystem.write("/work/task.py", "print(6 * 7)")
        result = await sbx.exec("python3 /work/task.py")
        print(result.stdout)   # "42\\n"
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import AsyncGenerator, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, overload

import httpx

from ... import models
from ...errors import CryoboxError, NotFound
from ...models import OnTimeoutAction
from .. import _base, _network, _requests, _snapshots, _sse
from .._base import DEFAULT_RETRY, ClientConfig, ExecResult, Lifecycle, RetryPolicy, SharedClient, StreamEvent
from .._network import CreateNetwork
from .._procs import PortUrls
from .._sse import OutputCallback
from ._http import open_client, output_stream, send
from .code import AsyncCodeInterpreter
from .filesystem import AsyncFilesystem
from .network import AsyncNetworkControl
from .observe import AsyncObserve
from .processes import AsyncProcess, AsyncProcesses
from .snapshots import AsyncForkTree

__all__ = ["AsyncFilesystem", "AsyncProcess", "AsyncProcesses", "AsyncSandbox"]


class AsyncSandbox(PortUrls, AsyncCodeInterpreter, AsyncNetworkControl, AsyncObserve):
    """One sandbox. Build it with ``create`` or ``connect``; ``async with`` kills it on exit.

    ``filesystem`` and ``processes`` are its files and background processes; ``run_code`` and ``code_contexts``
    its code interpreter (``AsyncCodeInterpreter``, template ``code-interpreter``); ``port_url(port)`` / ``get_host``
    (no IO, from ``_procs.PortUrls``) address its ports through the control plane (send ``Authorization: Bearer``);
    ``network``, ``get_network``, ``set_network`` and ``egress_log`` its network policy (``AsyncNetworkControl``);
    ``metrics`` and ``logs`` its samples and log (``AsyncObserve``).

    The object owns its HTTP client: ``aclose()`` releases it and leaves the sandbox running, ``kill()`` deletes
    the sandbox and releases it. Forks share their parent's client; the last of them to be closed closes it.
    """

    def __init__(
        self,
        info: models.Sandbox,
        config: ClientConfig,
        http: httpx.AsyncClient | None = None,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        self.info = info
        self._config = config
        self._http = http if http is not None else open_client(config)
        self._retry = retry
        self._shared = SharedClient()
        self._released = False
        self.filesystem = AsyncFilesystem(self)
        self.processes = AsyncProcesses(self)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r}, template={self.info.template!r}, status={self.info.status!r})"

    async def _send(self, request: _requests.ApiRequest) -> httpx.Response:
        return await send(self._http, request, self._retry)

    def _adopt(self, info: models.Sandbox) -> AsyncSandbox:
        """An object for the fork ``info``, sharing this one's configuration, retry policy and HTTP client."""
        child = type(self)(info, self._config, self._http, retry=self._retry)
        child._shared = self._shared.join()
        return child

    # --- construction --------------------------------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        template: str = "code-interpreter",
        *,
        ttl_seconds: int | None = None,
        persistent: bool = False,
        metadata: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        network: CreateNetwork | None = None,
        from_snapshot: str | None = None,
        on_timeout: OnTimeoutAction | None = None,
        auto_wake: bool | None = None,
        volumes: Sequence[Mapping[str, Any]] | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        http: httpx.AsyncClient | None = None,
    ) -> AsyncSandbox:
        """Create a sandbox (a snapshot restore of ``template``, or of ``from_snapshot``).

        Capacity refusals (503 / 429 with ``Retry-After``) are retried with jitter within ``retry.budget_s``.
        ``api_url`` / ``api_key`` default to ``$CRYOBOX_API_URL`` / ``$CRYOBOX_API_KEY``. ``http`` is an optional
        client to use (custom transport, tests); the returned sandbox takes ownership of it. ``network`` is the
        sandbox's network policy (a ``NetworkPolicy`` or a mapping of its fields, see ``set_network``; the older
        ``{"egress": "allow"|"deny", "allow": [cidrs]}`` is still accepted); none: the server's default.
        ``on_timeout``: what the TTL's expiry does — ``"kill"`` (the default) or ``"hibernate"`` (kept, paused,
        until resumed or the server's paused retention passes); ``auto_wake``: whether any request wakes it when
        hibernated (default ``True``; ``False``: only ``resume()``). ``volumes``: ``[{"name", "path", "read_only"}]``
        of the workspace's volumes to mount (one writer or any number of readers; see ``Volumes``).

        :raises HostUnavailable: no capacity within the retry budget (``retry_after_s`` says when to try again).
        :raises QuotaExceeded: rate limited beyond the retry budget.
        :raises NotFound: unknown template or snapshot.
        :raises InvalidArgument: ``network`` is not a valid policy (nothing is sent).
        """
        request = _requests.create_request(
            template,
            ttl_seconds=ttl_seconds,
            persistent=persistent,
            metadata=metadata,
            env=env,
            network=None if network is None else _network.create_body(network),
            from_snapshot=from_snapshot,
            on_timeout=on_timeout,
            auto_wake=auto_wake,
            volumes=volumes,
        )
        return await cls._attach(ClientConfig.resolve(api_url, api_key, timeout_s), http, request, retry)

    @classmethod
    async def _attach(
        cls, config: ClientConfig, http: httpx.AsyncClient | None, request: _requests.ApiRequest, retry: RetryPolicy
    ) -> AsyncSandbox:
        """Send a request answered by a Sandbox and wrap it; a client opened here is closed if that fails."""
        client = http if http is not None else open_client(config)
        try:
            info = _base.parse_sandbox(await send(client, request, retry))
        except BaseException:
            if http is None:
                await client.aclose()
            raise
        return cls(info, config, client, retry=retry)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        *,
        api_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        http: httpx.AsyncClient | None = None,
    ) -> AsyncSandbox:
        """Attach to an existing sandbox.

        :raises NotFound: no such sandbox (or it belongs to another workspace).
        """
        config = ClientConfig.resolve(api_url, api_key, timeout_s)
        return await cls._attach(config, http, _requests.get_request(sandbox_id), retry)

    @classmethod
    async def list(
        cls,
        *,
        status: str | None = None,
        metadata: Mapping[str, str] | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        http: httpx.AsyncClient | None = None,
    ) -> list[models.Sandbox]:
        """The workspace's sandboxes, optionally only those in ``status`` whose metadata contains ``metadata``.

        A given ``http`` client is left open.
        """
        config = ClientConfig.resolve(api_url, api_key, timeout_s)
        client = http if http is not None else open_client(config)
        try:
            response = await send(client, _requests.list_request(status=status, metadata=metadata), DEFAULT_RETRY)
            return _base.parse_sandbox_list(response)
        finally:
            if http is None:
                await client.aclose()

    # --- state and lifecycle -------------------------------------------------------------------------------------

    async def refresh(self) -> models.Sandbox:
        """Re-read the sandbox from the API into ``info``."""
        self.info = _base.parse_sandbox(await self._send(_requests.get_request(self.id)))
        return self.info

    async def inspect_net(self) -> dict[str, Any]:
        """The guest's view of the network and time: sockets, neighbours, resolver config, interfaces, wall and
        monotonic clocks, instance id. Take one before a snapshot and one after a restore, and diff them."""
        body: dict[str, Any] = (await self._send(_requests.inspect_net_request(self.id))).json()
        return body

    async def lifecycle(self) -> Lifecycle:
        return _base.parse_lifecycle(await self._send(_requests.lifecycle_request(self.id)))

    async def set_ttl(self, seconds: int) -> Lifecycle:
        """Reset the time to live to ``seconds`` from now.

        :raises InvalidArgument: ``seconds`` is out of range.
        """
        return await self._update_lifecycle(_requests.update_lifecycle_request(self.id, ttl_seconds=seconds))

    async def set_persistent(self, persistent: bool) -> Lifecycle:
        """A persistent sandbox never expires."""
        return await self._update_lifecycle(_requests.update_lifecycle_request(self.id, persistent=persistent))

    async def set_timeout_action(self, on_timeout: OnTimeoutAction, *, auto_wake: bool | None = None) -> Lifecycle:
        """What the TTL's expiry does (``"kill"`` or ``"hibernate"``) and, if given, whether requests wake it
        when hibernated.

        :raises InvalidArgument: an unknown action.
        """
        request = _requests.update_lifecycle_request(self.id, on_timeout=on_timeout, auto_wake=auto_wake)
        return await self._update_lifecycle(request)

    async def _update_lifecycle(self, request: _requests.ApiRequest) -> Lifecycle:
        lifecycle = _base.parse_lifecycle(await self._send(request))
        self.info = self.info.model_copy(
            update={
                "persistent": lifecycle.persistent,
                "expires_at": lifecycle.expires_at,
                "on_timeout": lifecycle.on_timeout,
                "auto_wake": lifecycle.auto_wake,
            }
        )
        return lifecycle

    async def pause(self) -> None:
        """Freeze the vCPUs in place (``info.status`` becomes ``paused``) until ``resume()``."""
        await self._power("pause", "paused")

    async def resume(self) -> None:
        """Continue a paused sandbox (its clock is re-synced)."""
        await self._power("resume", "running")

    async def hibernate(self) -> None:
        """Snapshot the sandbox to disk and stop it; ``wake()`` (or any request to it) brings it back."""
        await self._power("hibernate")

    async def wake(self) -> None:
        """Restore a hibernated sandbox."""
        await self._power("wake")

    async def _power(self, action: _requests.PowerAction, status: models.SandboxStatus | None = None) -> None:
        """:raises StateError: the sandbox is not in a state ``action`` applies to."""
        response = await self._send(_requests.power_request(self.id, action))
        new_status = status if status is not None else _snapshots.parse_status(response)
        self.info = self.info.model_copy(update={"status": new_status})

    # --- snapshots and forks -------------------------------------------------------------------------------------

    async def snapshot(
        self, labels: Mapping[str, str] | None = None, *, retain: bool = False, quiesce: bool = False
    ) -> models.Snapshot:
        """Snapshot memory and disk; the sandbox keeps running. Restore with ``create(from_snapshot=snap.id)``.

        ``retain`` keeps the snapshot when this sandbox is killed; ``quiesce`` refuses (``StateError``)
        while the guest holds established TCP connections.
        """
        request = _requests.snapshot_request(self.id, labels=labels, retain=retain, quiesce=quiesce)
        return _snapshots.parse_snapshot(await self._send(request))

    async def snapshots(self) -> builtins.list[models.Snapshot]:
        """This sandbox's snapshots, newest first."""
        request = _requests.list_snapshots_request(sandbox_id=self.id, labels=None)
        return _snapshots.parse_snapshot_list(await self._send(request))

    async def fork(self, metadata: Mapping[str, str] | None = None) -> AsyncSandbox:
        """A new sandbox booted fresh from a copy of this one's disk (not its memory); it shares this client."""
        forked = _snapshots.parse_fork(await self._send(_requests.fork_request(self.id, metadata=metadata)))
        return self._adopt(forked.sandbox)

    async def fork_tree(self, count: int = 2, *, metadata: Mapping[str, str] | None = None) -> AsyncForkTree:
        """``count`` children restored from one snapshot of this sandbox (memory and disk), to try alternatives.

        Children that could not be created are reported in ``errors``; keep one with ``AsyncForkTree.promote``.

        :raises InvalidArgument: ``count`` is out of range (1 to 16).
        """
        request = _requests.fork_tree_request(self.id, count=count, metadata=metadata)
        body = _snapshots.parse_fork_tree(await self._send(request))
        children = [self._adopt(info) for info in body.children]
        return AsyncForkTree(body.tree_id, body.parent_id, body.snapshot_id, children, body.errors)

    async def promote(self, tree_id: str, *, cleanup_siblings: bool = True) -> models.PromoteResult:
        """Make this child of fork tree ``tree_id`` the winner; ``cleanup_siblings`` deletes the other children.

        :raises NotFound: no such tree, or this sandbox is not one of its children.
        """
        request = _requests.promote_request(self.id, tree_id=tree_id, cleanup_siblings=cleanup_siblings)
        return _snapshots.parse_promote(await self._send(request))

    # --- commands ------------------------------------------------------------------------------------------------

    @overload
    async def exec(
        self,
        cmd: str,
        *,
        timeout_seconds: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        check: bool = False,
        background: Literal[False] = False,
    ) -> ExecResult: ...

    @overload
    async def exec(
        self,
        cmd: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        background: Literal[True],
    ) -> AsyncProcess: ...

    async def exec(
        self,
        cmd: str,
        *,
        timeout_seconds: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        check: bool = False,
        background: bool = False,
    ) -> ExecResult | AsyncProcess:
        """Run ``cmd`` with ``/bin/sh -c`` in the sandbox and wait for it.

        ``background=True`` starts it like ``processes.start`` (``stdin``, if given, is written and closed) and
        returns its :class:`AsyncProcess` at once; ``timeout_seconds``/``check`` then do not apply (see ``wait``).

        :raises SandboxTimeout: the command ran past ``timeout_seconds`` (its process group was killed).
        :raises CommandFailed: ``check`` is set and the exit code is not 0.
        """
        if background:
            return await self.processes._start_fed(cmd, env=env, cwd=cwd, stdin=stdin)
        request = _requests.exec_request(
            self.id,
            cmd,
            timeout_seconds=timeout_seconds,
            env=env,
            cwd=cwd,
            stdin=stdin,
            client_timeout_s=self._config.timeout_s,
        )
        return _base.parse_exec(await self._send(request), cmd=cmd, check=check)

    async def exec_stream(
        self,
        cmd: str,
        *,
        timeout_seconds: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> AsyncGenerator[StreamEvent]:
        """Yield ``stdout`` / ``stderr`` events as the command produces output, then exactly one ``exit`` event.

        ``on_stdout`` / ``on_stderr``, when given, are also called with each chunk. Stop early by closing the
        iterator (``contextlib.aclosing``); the HTTP stream is released when it closes.

        :raises SandboxTimeout: the command ran past ``timeout_seconds``.
        :raises GuestError: the stream ended without an exit code.
        :raises CryoboxError: any other ``error`` event, mapped by its code.
        """
        request = _requests.exec_request(
            self.id,
            cmd,
            timeout_seconds=timeout_seconds,
            env=env,
            cwd=cwd,
            stdin=stdin,
            client_timeout_s=self._config.timeout_s,
            stream=True,
        )
        events = output_stream(self._http, request, on_stdout, on_stderr, _sse.stream_ended_early)
        async with contextlib.aclosing(events):
            async for event in events:  # noqa: UP028 (`yield from` in the sync twin)
                yield event

    # --- teardown ------------------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Release this object's HTTP connections (unless forks still share them); the sandbox keeps running."""
        if self._released:
            return
        self._released = True
        if self._shared.leave():
            await self._http.aclose()

    async def kill(self, *, keep_snapshots: bool = False) -> None:
        """Delete the sandbox (and its non-retained snapshots unless ``keep_snapshots``), then ``aclose()``.

        Killing an already-deleted sandbox is not an error.
        """
        if self._released and self.info.status == "stopped":
            return  # killed already, or deleted by the server (a fork-tree sibling removed by promote)
        try:
            await self._send(_requests.kill_request(self.id, keep_snapshots=keep_snapshots))
        except NotFound:
            pass
        finally:
            await self.aclose()
        self.info = self.info.model_copy(update={"status": "stopped"})

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            await self.kill()
            return
        try:
            await self.kill()
        except CryoboxError as kill_error:  # do not hide the exception that is already propagating
            exc.add_note(f"cryobox: killing sandbox {self.id} also failed: {kill_error!r}")
