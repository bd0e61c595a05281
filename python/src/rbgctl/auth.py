"""The cluster secret's handshake, as the Rust roles run it (``src/auth.rs``).

A master or store started with ``--auth-token-file`` serves a connection only once it has
proven it holds the same secret: the client sends a fresh nonce (``AUTH_HELLO``), the server
answers its own nonce and an HMAC-SHA256 over both, which the client checks, and the client
answers its HMAC over both (``AUTH_PROOF``). The secret never crosses the wire.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Optional

from .errors import ConfigError, TransportError

NONCE_LEN = 16
MIN_SECRET_LEN = 16
MAX_SECRET_LEN = 4096
TOKEN_FILE_ENV = "RBGCTL_AUTH_TOKEN_FILE"

_SERVER = b"rbgctl auth v1 server"
_CLIENT = b"rbgctl auth v1 client"


def load_secret(path: str) -> bytes:
    """The secret in ``path`` without surrounding whitespace; at least 16 bytes."""
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_SECRET_LEN + 1)
    except OSError as e:
        raise ConfigError(f"auth token file {path}: {e.strerror}") from None
    if len(text) > MAX_SECRET_LEN:
        raise ConfigError(f"auth token file {path}: larger than {MAX_SECRET_LEN} bytes; is it the right file?")
    secret = text.strip()
    if not all(0x21 <= b <= 0x7E for b in secret):
        raise ConfigError(
            f"auth token file {path}: the secret must be printable ASCII without spaces "
            "(it travels in HTTP headers); base64 output is"
        )
    if len(secret) < MIN_SECRET_LEN:
        raise ConfigError(
            f"auth token file {path}: the secret is {len(secret)} bytes; use at least {MIN_SECRET_LEN} "
            f"(e.g. `head -c 32 /dev/urandom | base64 > {path}`)"
        )
    return secret


def prove(secret: bytes, server: bool, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """The server's or the client's proof over both nonces."""
    label = _SERVER if server else _CLIENT
    return hmac.new(secret, label + bytes(client_nonce) + bytes(server_nonce), hashlib.sha256).digest()


def handshake(conn, secret: bytes) -> None:
    """Proves ``secret`` on ``conn`` and checks that the server holds it too."""
    from . import protocol as p
    from .errors import RemoteError

    mine = os.urandom(NONCE_LEN)
    try:
        nonce, proof = conn.call(p.Opcode.AUTH_HELLO, p.auth_hello_req(mine), p.parse_auth_challenge)
    except RemoteError as e:
        conn.close()
        if e.status == p.Status.UNKNOWN_OPCODE:
            raise TransportError(conn.addr, "the server does not know authentication (an older version)") from None
        raise
    if not proof:
        conn.close()
        raise TransportError(conn.addr, "the server holds no cluster secret; give it the same --auth-token-file")
    if not hmac.compare_digest(proof, prove(secret, True, mine, nonce)):
        conn.close()
        raise TransportError(conn.addr, "the server did not prove it holds this cluster secret")
    conn.call(p.Opcode.AUTH_PROOF, p.auth_proof_req(prove(secret, False, mine, nonce)), p.parse_empty)


def secret_from(path: Optional[str]) -> Optional[bytes]:
    return None if not path else load_secret(path)
