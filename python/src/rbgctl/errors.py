"""The client's errors. Every failure the client reports is an :class:`RbgctlError`."""

from __future__ import annotations

from .status import status_name


class RbgctlError(Exception):
    """Base class of every error raised or returned by this package."""


class ConfigError(RbgctlError, ValueError):
    """A setting is missing, malformed or unknown."""


class ProtocolError(RbgctlError):
    """A peer sent something that is not rbgctl protocol version 1, or a value cannot be encoded."""


class TransportError(RbgctlError):
    """A connection could not be made, broke, or timed out (the peer may be dead)."""

    def __init__(self, addr: str, cause: BaseException | str):
        super().__init__(f"{addr}: {cause}")
        self.addr = addr
        self.cause = cause


class RemoteError(RbgctlError):
    """The master or a store answered with a non-OK status."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status_name(status)}: {message}")
        self.status = status
        self.message = message


class ObjectNotFound(RemoteError):
    """No object (or no finished put) exists under the key."""


class ChecksumError(RbgctlError):
    """Every readable replica failed its CRC-32C check."""


class BufferTooSmall(RbgctlError, ValueError):
    """The caller's buffer is smaller than the stored value."""

    def __init__(self, key: str, needed: int, got: int):
        super().__init__(f"{key!r}: buffer of {got} bytes is smaller than the value ({needed} bytes)")
        self.key = key
        self.needed = needed
        self.got = got


class Unreadable(RbgctlError):
    """No replica of the object could be read."""
