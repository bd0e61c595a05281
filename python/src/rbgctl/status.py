"""Reply status codes (`Status` in the Rust transfer core): a leaf module, so that
:mod:`errors` and :mod:`protocol` both use it without importing each other."""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    OK = 0
    INTERNAL = 1
    INVALID_PARAMS = 2
    UNKNOWN_OPCODE = 3
    MALFORMED_FRAME = 4
    OBJECT_NOT_FOUND = 10
    PUT_IN_PROGRESS = 11
    OBJECT_HAS_LEASE = 12
    REPLICA_NOT_READY = 13
    NO_SPACE = 14
    VALUE_TOO_LARGE = 15
    SEGMENT_NOT_FOUND = 16
    ILLEGAL_CLIENT = 17
    OUT_OF_BOUNDS = 18
    SEGMENT_EXISTS = 19
    WRITE_SUPERSEDED = 20
    OBJECT_UNAVAILABLE = 21
    NOT_LEADER = 22
    CHECKSUM_MISMATCH = 23
    NOT_DURABLE = 24
    UNAUTHENTICATED = 25
    CONNECTION_REFUSED = 26  # unasked, with request id REFUSAL_ID, before the server closes
    NOT_GRANTED = 27  # a write or seal the master granted no put (range, size, version)
    TENANT_QUOTA_EXCEEDED = 28  # the put would take its tenant past its quota
    TENANT_NOT_REGISTERED = 29  # the master's tenants file does not name the tenant


def status_name(code: int) -> str:
    try:
        return Status(code).name
    except ValueError:
        return f"STATUS_{code}"
