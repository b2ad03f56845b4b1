"""Backward-compatible import path: configuration and error mapping now live in ``cryobox.sdk._base``."""

from ._base import DEFAULT_URL, ClientConfig, error_from_response, raise_for_error, transport_error

__all__ = ["DEFAULT_URL", "ClientConfig", "error_from_response", "raise_for_error", "transport_error"]
