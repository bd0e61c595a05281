"""Client settings, from arguments, a mapping (SGLang's extra config), a file or the environment.

Where the master is, in order of precedence:

1. an explicit ``master`` (or Mooncake's ``master_server_address``) setting;
2. ``MOONCAKE_CONFIG_PATH``: a Mooncake store JSON file (its ``master_server_address``);
3. ``RBGCTL_MASTER``, then ``MOONCAKE_MASTER``: ``host:port`` of the master's RPC port, or
   ``etcd://h1:2379;h2:2379[/cluster_id]`` / ``k8s://namespace/lease`` for elected masters.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from .errors import ConfigError
from .protocol import ReplicateConfig

log = logging.getLogger("rbgctl.config")

# Keys of Mooncake's store client config that mean nothing to this client. They are accepted so
# that an existing Mooncake JSON file or extra config works unchanged.
MOONCAKE_KEYS_IGNORED = frozenset(
    {
        "local_hostname",
        "global_segment_size",
        "local_buffer_size",
        "protocol",
        "device_name",
        "master_metrics_port",
        "check_server",
        "standalone_storage",
        "client_server_address",
        "enable_ssd_offload",
        "ssd_offload_path",
    }
)


def check_master(what: str, value: Any) -> str:
    """A master address: ``host:port``, ``etcd://h1:2379;h2:2379[/cluster_id]`` or
    ``k8s://namespace/lease`` (elected masters, see :mod:`rbgctl.leader`)."""
    from .leader import is_elected, parse_master

    if isinstance(value, str) and is_elected(value):
        parse_master(value)
        return value
    return check_endpoint(what, value)


DEFAULT_TENANT = "default"
_TENANT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def check_tenant(what: str, value: Any) -> str:
    """A tenant's name: 1 to 64 letters, digits, ``.``, ``_`` or ``-`` (as the master checks)."""
    if not isinstance(value, str) or not 1 <= len(value) <= 64 or not set(value) <= _TENANT_CHARS:
        raise ConfigError(f"{what}: {value!r} is not a tenant name: use 1 to 64 letters, digits, '.', '_' or '-'")
    return value


def held_key(tenant: str, key: str) -> str:
    """The key the master holds for ``tenant``'s ``key``: the default tenant's keys as they
    are, any other's behind the namespace mark (``\\x01<tenant>\\x01<key>``)."""
    if key.startswith("\x01"):
        raise ConfigError("a key may not begin with the byte 0x01 (it marks a tenant's namespace)")
    return key if tenant == DEFAULT_TENANT else f"\x01{tenant}\x01{key}"


def check_endpoint(what: str, value: Any) -> str:
    """``host:port`` with a port in 1..65535, or a clear error."""
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(f"{what}: expected host:port, got {value!r}")
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    if not host:
        raise ConfigError(f"{what}: no host in {value!r}")
    try:
        p = int(port)
    except ValueError:
        raise ConfigError(f"{what}: port {port!r} is not a number") from None
    if not 1 <= p <= 65535:
        raise ConfigError(f"{what}: port {p} is not in 1..65535")
    return value


def _bool(what: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{what}: expected true or false, got {v!r}")


def _number(what: str, v: Any, kind=float, minimum: float = 0) -> Any:
    if isinstance(v, bool):
        raise ConfigError(f"{what}: expected a number, got {v!r}")
    try:
        n = kind(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: expected a number, got {v!r}") from None
    if n < minimum:
        raise ConfigError(f"{what}: {n} is below {minimum}")
    return n


@dataclass
class ClientConfig:
    """How the client reaches the pool.

    Attributes:
        master: ``host:port`` of the master's RPC port (``rbgctl master --rpc-port``, 50051 by
            default).
        same_host_shm: read and write replicas on this host's stores through their shared-memory
            segment file instead of TCP. Default true.
        connect_timeout_s: seconds to open a connection. Default 5.
        io_timeout_s: seconds any one socket read or write may block. Default 30.
        heartbeat_interval_s: how often the heartbeat looks at the connections to the master
            (each tick moved by up to half of itself at random): it pings when they changed,
            which binds a connection to this client and keeps it, with its unfinished puts,
            alive at the master while that connection stays open. Default 1.
        replicate: the default :class:`ReplicateConfig` of puts. Default one replica.
        auth_token_file: a file holding the cluster secret, when the pool requires one
            (``rbgctl master --auth-token-file``); ``RBGCTL_AUTH_TOKEN_FILE`` sets it too.
            Default none.
        metadata_server: how segments that Mooncake's processes mounted are found, as Mooncake
            names it (``metadata_server``, ``MOONCAKE_TE_META_DATA_SERVER``): ``P2PHANDSHAKE``
            (the default), or the HTTP metadata server they publish to
            (``http://host:port/metadata``).
        tenant: the tenant whose namespace this client's keys live in (Mooncake's
            ``tenant_id``, ``MOONCAKE_TENANT_ID``); the master's tenants file must name it.
            Default ``default``.
    """

    master: str
    same_host_shm: bool = True
    connect_timeout_s: float = 5.0
    io_timeout_s: float = 30.0
    heartbeat_interval_s: float = 1.0
    replicate: ReplicateConfig = field(default_factory=ReplicateConfig)
    auth_token_file: Optional[str] = None
    metadata_server: str = "P2PHANDSHAKE"
    tenant: str = DEFAULT_TENANT

    def __post_init__(self) -> None:
        check_master("master", self.master)
        check_tenant("tenant", self.tenant)
        if self.auth_token_file is not None and not isinstance(self.auth_token_file, str):
            raise ConfigError(f"auth_token_file: expected a path, got {self.auth_token_file!r}")
        for name in ("connect_timeout_s", "io_timeout_s", "heartbeat_interval_s"):
            if _number(name, getattr(self, name)) <= 0:
                raise ConfigError(f"{name} must be above 0")

    # Keys a mapping may hold, besides Mooncake's (see MOONCAKE_KEYS_IGNORED).
    KEYS = (
        "master",
        "master_server_address",
        "same_host_shm",
        "connect_timeout_s",
        "io_timeout_s",
        "heartbeat_interval_s",
        "replica_num",
        "soft_pin",
        "soft_pin_ttl_ms",
        "preferred_segment",
        "auth_token_file",
        "metadata_server",
        "tenant",
        "tenant_id",
    )

    def auth_secret(self) -> Optional[bytes]:
        """The cluster secret from ``auth_token_file``, read now (a clear error if unusable)."""
        from .auth import secret_from

        return secret_from(self.auth_token_file)

    @classmethod
    def from_mapping(
        cls,
        values: Mapping[str, Any],
        source: str = "config",
        extra_keys: frozenset = frozenset(),
        env: Optional[Mapping[str, str]] = None,
    ) -> "ClientConfig":
        """Settings from a dict. Unknown keys are an error (a typo must not silently fall back
        to defaults); ``extra_keys`` are further keys the caller handles itself. Without a master
        setting the environment names it (see the module's documentation)."""
        unknown = sorted(set(values) - set(cls.KEYS) - MOONCAKE_KEYS_IGNORED - set(extra_keys))
        if unknown:
            known = ", ".join(sorted(set(cls.KEYS) | set(extra_keys)))
            raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; known keys: {known}")
        _warn_mooncake_only(values, source)
        master = values.get("master", values.get("master_server_address"))
        if master is None:
            master = master_from_env(env)
            if master is None:
                raise ConfigError(
                    f"{source}: no master address: set 'master' (or 'master_server_address'), "
                    "or MOONCAKE_CONFIG_PATH, RBGCTL_MASTER or MOONCAKE_MASTER in the environment"
                )
        kwargs: dict = {"master": check_master(f"{source}: master", master)}
        token_file = values.get("auth_token_file", _env(env).get("RBGCTL_AUTH_TOKEN_FILE"))
        if token_file:
            kwargs["auth_token_file"] = str(token_file)
        metadata_server = values.get("metadata_server", _env(env).get("MOONCAKE_TE_META_DATA_SERVER"))
        if metadata_server:
            kwargs["metadata_server"] = str(metadata_server)
        tenant = values.get("tenant", values.get("tenant_id", _env(env).get("MOONCAKE_TENANT_ID")))
        if tenant:
            kwargs["tenant"] = check_tenant(f"{source}: tenant", tenant)
        if "same_host_shm" in values:
            kwargs["same_host_shm"] = _bool(f"{source}: same_host_shm", values["same_host_shm"])
        for name in ("connect_timeout_s", "io_timeout_s", "heartbeat_interval_s"):
            if name in values:
                kwargs[name] = _number(f"{source}: {name}", values[name])
        rep = ReplicateConfig(
            replica_num=_number(f"{source}: replica_num", values.get("replica_num", 1), int, 1),
            soft_pin=_bool(f"{source}: soft_pin", values.get("soft_pin", False)),
            soft_pin_ttl_ms=_number(f"{source}: soft_pin_ttl_ms", values.get("soft_pin_ttl_ms", 0), int),
            preferred_segment=str(values.get("preferred_segment", "")),
        )
        if rep.replica_num > 255:
            raise ConfigError(f"{source}: replica_num {rep.replica_num} is over 255")
        kwargs["replicate"] = rep
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str) -> "ClientConfig":
        """A JSON file (Mooncake's store config format works) or a TOML file."""
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise ConfigError(f"{path}: {e.strerror}") from None
        if path.endswith(".toml"):
            try:
                import tomllib  # type: ignore[import-not-found]
            except ImportError:  # Python < 3.11
                try:
                    import tomli as tomllib  # type: ignore[no-redef]
                except ImportError:
                    raise ConfigError(
                        f"{path}: reading TOML needs Python 3.11 or the tomli package"
                    ) from None
            try:
                values = tomllib.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
                raise ConfigError(f"{path}: not valid TOML: {e}") from None
        else:
            try:
                values = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ConfigError(f"{path}: not valid JSON: {e}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected an object of settings")
        return cls.from_mapping(values, source=path, env={})

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "ClientConfig":
        """The master from ``MOONCAKE_CONFIG_PATH``, ``RBGCTL_MASTER`` or ``MOONCAKE_MASTER``."""
        env = os.environ if env is None else env
        path = env.get("MOONCAKE_CONFIG_PATH")
        if path:
            cfg = cls.from_file(path)
            if cfg.auth_token_file is None and env.get("RBGCTL_AUTH_TOKEN_FILE"):
                cfg.auth_token_file = env["RBGCTL_AUTH_TOKEN_FILE"]
            return cfg
        _check_protocol("MOONCAKE_PROTOCOL", env.get("MOONCAKE_PROTOCOL"))
        master = master_from_env(env)
        if master is None:
            raise ConfigError("set RBGCTL_MASTER or MOONCAKE_MASTER (host:port) or MOONCAKE_CONFIG_PATH")
        return cls(
            master=check_master("RBGCTL_MASTER/MOONCAKE_MASTER", master),
            auth_token_file=env.get("RBGCTL_AUTH_TOKEN_FILE") or None,
            metadata_server=env.get("MOONCAKE_TE_META_DATA_SERVER") or "P2PHANDSHAKE",
        )


def _env(env: Optional[Mapping[str, str]]) -> Mapping[str, str]:
    return os.environ if env is None else env


def master_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    env = os.environ if env is None else env
    path = env.get("MOONCAKE_CONFIG_PATH")
    if path:
        return ClientConfig.from_file(path).master
    return env.get("RBGCTL_MASTER") or env.get("MOONCAKE_MASTER") or None


def _check_protocol(what: str, value: Any) -> None:
    """tcp or rdma. This client moves bytes over TCP (and same-host shared memory) either way:
    stores that serve RDMA serve TCP too, so a deployment that sets rdma for every process
    works, and the log says which path this one takes."""
    proto = str(value or "tcp").strip().lower()
    if proto == "rdma":
        log.warning(
            "%s is rdma: the Python client reaches stores over TCP (RDMA stores serve it too); "
            "the Rust client and HiCache's Rust path use RDMA",
            what,
        )
        return
    if proto != "tcp":
        raise ConfigError(f"{what}: expected tcp or rdma, got {value!r}")


def _warn_mooncake_only(values: Mapping[str, Any], source: str) -> None:
    _check_protocol(f"{source}: protocol", values.get("protocol"))
    size = values.get("global_segment_size")
    if size not in (None, 0, "0"):
        log.warning(
            "%s: global_segment_size is ignored: this client contributes no memory; run "
            "`rbgctl store` on this host instead (its replicas are then read through shared memory)",
            source,
        )


__all__ = ["ClientConfig", "ReplicateConfig", "check_endpoint", "master_from_env"]
