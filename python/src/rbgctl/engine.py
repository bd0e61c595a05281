"""What the engine integrations (``rbgctl.hicache`` for SGLang, ``rbgctl.vllm`` for vLLM) share:
attaching to a pool that may not be up yet, and storing content-addressed KV pages.

Both name a page by a hash of its tokens, so a key that is stored already holds the right bytes:
a backup puts only the keys the pool lacks, and another engine putting the same page at the same
moment is not an error.
"""

from __future__ import annotations

import logging
import time
from typing import List, Sequence

from .client import Client
from .config import ClientConfig
from .errors import ConfigError, RbgctlError, RemoteError
from .protocol import Status

log = logging.getLogger("rbgctl.engine")


def attach(config: ClientConfig, timeout: float, hint: str) -> Client:
    """A client, once the master answers; waits up to ``timeout`` seconds for it, then raises
    an error that ends with ``hint`` (where the engine's user raises the wait)."""
    deadline = time.monotonic() + max(0.0, timeout)
    pause = 0.1
    while True:
        try:
            return Client(config)
        except ConfigError:
            raise
        except RbgctlError as e:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RbgctlError(
                    f"the pool's master {config.master} did not answer within {timeout:g} s "
                    f"({e}); start it, or {hint}"
                ) from e
            log.warning("waiting for the pool's master %s: %s", config.master, e)
            time.sleep(min(pause, left))
            pause = min(pause * 2, 2.0)


def leading_true(flags: Sequence[bool]) -> int:
    """How many flags from the start are true."""
    n = 0
    for f in flags:
        if not f:
            break
        n += 1
    return n


def missing(client: Client, keys: List[str]) -> List[int]:
    """The indices of the keys the pool does not hold; all of them when it cannot say (logged)."""
    try:
        present = client.batch_exists(keys)
    except RbgctlError as e:
        log.warning("existence check before a backup: %s", e)
        present = [False] * len(keys)
    return [i for i, p in enumerate(present) if not p]


def put_missing(client: Client, keys: List[str], sources: list) -> List[bool]:
    """Puts the content-addressed pages the pool does not hold yet; per page, whether it is
    stored now. Failures are logged, never raised."""
    todo = missing(client, keys)
    ok = [True] * len(keys)
    if todo:
        for i, good in zip(todo, put_pages(client, [keys[i] for i in todo], [sources[i] for i in todo])):
            ok[i] = good
    return ok


def put_pages(client: Client, keys: List[str], sources: list) -> List[bool]:
    """Puts content-addressed pages; per page, whether it is stored now (a put of the same page
    by another engine still in progress counts). Failures are logged, never raised."""
    try:
        errors = client.batch_put(keys, sources)
    except RbgctlError as e:
        errors = [e] * len(keys)
    # Another engine putting the same page at the same moment writes the same bytes.
    ok = [err is None or (isinstance(err, RemoteError) and err.status == Status.PUT_IN_PROGRESS) for err in errors]
    failed = [(k, e) for k, e, good in zip(keys, errors, ok) if not good]
    if failed:
        log.warning("backup: %d of %d pages not stored (first: %s: %s)", len(failed), len(keys), *failed[0])
    return ok
