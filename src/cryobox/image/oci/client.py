"""A client of the distribution API (v2) over httpx: manifests and blobs of one registry, with its auth.

Synchronous (the host agent calls a pull in a worker thread). Authentication answers the registry's ``401``:
``Bearer realm=…,service=…,scope=…`` fetches a token from the realm (anonymously, or with the registry's
credentials from :class:`RegistrySettings`) and retries; ``Basic`` retries with the credentials. Tokens are kept per
repository for the client's life. Blobs follow redirects (registries send them to object storage; httpx drops
the ``Authorization`` header on a redirect to another host).
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any

import httpx

from ...errors import ImagePullFailed, ImageTooLarge, NotFound
from .blobs import read_bounded, sha256_digest, verify_digest
from .challenge import Challenge, parse_challenges
from .limits import ByteLimit
from .mediatypes import ACCEPT
from .reference import Reference, is_digest
from .settings import RegistrySettings

TOKEN_LIMIT = ByteLimit("token_response", 1 << 20)


class RegistryClient:
    def __init__(self, settings: RegistrySettings, *, transport: httpx.BaseTransport | None = None) -> None:
        self._settings = settings
        self._http = httpx.Client(
            timeout=httpx.Timeout(settings.timeout_s),
            follow_redirects=True,
            transport=transport,
            headers={"User-Agent": "cryobox"},
        )
        self._auth: dict[tuple[str, str], str] = {}
        """(base URL, repository) -> the ``Authorization`` header that worked."""

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def manifest(self, ref: Reference, target: str, *, limit: ByteLimit) -> tuple[bytes, str, str]:
        """``(bytes, content type, digest)`` of the manifest or index ``target`` (a tag or digest) names."""
        with self._get(ref, f"manifests/{target}", accept=ACCEPT, what=f"manifest {target}") as resp:
            data = read_bounded(resp.iter_bytes(), limit, f"the manifest of {ref}")
            content_type = resp.headers.get("content-type", "")
            header_digest = resp.headers.get("docker-content-digest", "")
        if is_digest(target):
            verify_digest(data, target, f"the manifest of {ref}")
            return data, content_type, target
        digest = sha256_digest(data)
        if is_digest(header_digest) and header_digest != digest:
            verify_digest(data, header_digest, f"the manifest of {ref}")
        return data, content_type, digest

    @contextlib.contextmanager
    def blob_stream(self, ref: Reference, digest: str, *, what: str) -> Iterator[Iterable[bytes]]:
        """The blob's bytes as they arrive (the caller checks them: :func:`.blobs.write_blob`)."""
        with self._get(ref, f"blobs/{digest}", what=what) as resp:
            yield resp.iter_bytes()

    @contextlib.contextmanager
    def _get(self, ref: Reference, path: str, *, what: str, accept: str = "") -> Iterator[httpx.Response]:
        base = self._settings.base_url(ref)
        url = f"{base}/v2/{ref.repository}/{path}"
        key = (base, ref.repository)
        try:
            for attempt in (1, 2):
                headers = {"Accept": accept} if accept else {}
                if key in self._auth:
                    headers["Authorization"] = self._auth[key]
                with self._http.stream("GET", url, headers=headers) as resp:
                    if resp.status_code == 401 and attempt == 1:
                        challenges = [c for h in resp.headers.get_list("www-authenticate") for c in parse_challenges(h)]
                        self._auth[key] = self._answer(ref, challenges)
                        continue
                    _raise_for_status(resp, ref, what)
                    yield resp
                    return
        except httpx.HTTPError as exc:
            raise ImagePullFailed(
                f"registry {ref.registry} ({base}) failed on {what}: {type(exc).__name__}: {exc}",
                details={"registry": ref.registry},
            ) from exc

    def _answer(self, ref: Reference, challenges: list[Challenge]) -> str:
        creds = self._settings.credentials.get(ref.registry)
        for challenge in challenges:
            if challenge.scheme == "bearer" and challenge.params.get("realm"):
                return f"Bearer {self._token(ref, challenge, creds)}"
        for challenge in challenges:
            if challenge.scheme == "basic":
                if creds is None:
                    raise ImagePullFailed(
                        f"registry {ref.registry} asks for credentials (Basic) and none are configured",
                        details={"registry": ref.registry},
                    )
                return "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
        raise ImagePullFailed(
            f"registry {ref.registry} refused the request (401) without a challenge cryobox can answer",
            details={"registry": ref.registry, "challenges": [c.scheme for c in challenges]},
        )

    def _token(self, ref: Reference, challenge: Challenge, creds: tuple[str, str] | None) -> str:
        realm = challenge.params["realm"]
        params = {"scope": challenge.params.get("scope") or f"repository:{ref.repository}:pull"}
        if challenge.params.get("service"):
            params["service"] = challenge.params["service"]
        if not realm.startswith(("https://", "http://")):
            raise ImagePullFailed(f"registry {ref.registry}'s token realm {realm!r} is not an http(s) URL")
        try:
            with self._http.stream("GET", realm, params=params, auth=creds) as resp:
                if resp.status_code in (401, 403):
                    raise ImagePullFailed(
                        f"registry {ref.registry}'s token service refused "
                        + ("the configured credentials" if creds else "an anonymous token")
                        + f" for {params['scope']} (HTTP {resp.status_code})",
                        details={"registry": ref.registry, "status": resp.status_code},
                    )
                _raise_for_status(resp, ref, "a token")
                body: Any = json.loads(read_bounded(resp.iter_bytes(), TOKEN_LIMIT, "a token"))
        except (httpx.HTTPError, ValueError) as exc:
            raise ImagePullFailed(f"registry {ref.registry}'s token service failed: {exc}") from exc
        token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise ImagePullFailed(f"registry {ref.registry}'s token service answered without a token")
        return token


def _raise_for_status(resp: httpx.Response, ref: Reference, what: str) -> None:
    if resp.is_success:
        return
    detail = _registry_message(resp)
    status = resp.status_code
    if status == 404 and what.startswith("manifest"):
        raise NotFound(f"image {ref} not found in its registry{detail}", details={"image": str(ref)})
    if status in (401, 403):
        raise ImagePullFailed(
            f"registry {ref.registry} denied access to {ref.repository} (HTTP {status}){detail}",
            details={"registry": ref.registry, "status": status},
        )
    raise ImagePullFailed(
        f"registry {ref.registry} answered HTTP {status} for {what}{detail}",
        details={"registry": ref.registry, "status": status},
    )


def _registry_message(resp: httpx.Response) -> str:
    """The registry's own error text (``{"errors": [{"code", "message"}]}``), if short and present."""
    try:
        body = json.loads(read_bounded(resp.iter_bytes(), ByteLimit("error", 64 << 10), ""))
        errors = body.get("errors") if isinstance(body, dict) else None
        parts = [f"{e.get('code', '')}: {e.get('message', '')}" for e in errors or [] if isinstance(e, dict)]
    except (ValueError, httpx.HTTPError, ImageTooLarge):  # not the registry's JSON: say nothing of it
        return ""
    return f" ({'; '.join(parts)})" if parts else ""


__all__ = ["RegistryClient"]
