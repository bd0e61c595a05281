"""Finding the leader of elected masters (``rbgctl master --enable-ha``).

A master address may be ``host:port``, ``etcd://h1:2379;h2:2379[/cluster_id]`` or
``k8s://namespace/lease``. For the last two the leader is looked up where the masters elect it:

- etcd: the key ``mooncake-store/<cluster_id>/master_view`` through etcd's JSON gateway
  (``POST /v3/kv/range``); the key's create revision is the leadership epoch. The cluster id
  defaults to ``RBGCTL_CLUSTER_ID``, ``MC_STORE_CLUSTER_ID``, else ``mooncake_cluster``.
- Kubernetes: the Lease's annotation ``rbgctl.io/master-view``; its ``leaseTransitions`` is the
  epoch. In a pod the service account is used; elsewhere ``KUBECONFIG`` (a JSON kubeconfig, or
  YAML when PyYAML is installed) with a token or no credentials.
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .errors import ConfigError, TransportError

DEFAULT_CLUSTER_ID = "mooncake_cluster"
VIEW_ANNOTATION = "rbgctl.io/master-view"
LOOKUP_TIMEOUT_S = 2.0
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_CLUSTER_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


@dataclass(frozen=True)
class Leader:
    rpc: str
    epoch: int


def default_cluster_id() -> str:
    for var in ("RBGCTL_CLUSTER_ID", "MC_STORE_CLUSTER_ID"):
        v = os.environ.get(var, "").strip()
        if v:
            return v
    return DEFAULT_CLUSTER_ID


def parse_etcd_endpoints(spec: str, listing: str) -> List[str]:
    out = []
    for part in re.split(r"[;,]", listing):
        part = part.strip()
        if not part:
            continue
        if part.startswith("https://"):
            raise ConfigError(f"master {spec!r}: TLS to etcd is not supported; use http://")
        bare = part[len("http://") :] if part.startswith("http://") else part
        bare = bare.rstrip("/")
        host, _, port = bare.rpartition(":")
        if not host or "/" in host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"master {spec!r}: etcd endpoint {part!r} is not host:port")
        out.append(f"http://{bare}")
    if not out:
        raise ConfigError(f"master {spec!r}: no etcd endpoint (expected etcd://h1:2379;h2:2379)")
    return out


class Lookup:
    """Where an elected master's leader is looked up."""

    def leader(self) -> Optional[Leader]:
        raise NotImplementedError


class EtcdLookup(Lookup):
    def __init__(self, spec: str, endpoints: List[str], cluster_id: str):
        self.spec = spec
        self.endpoints = endpoints
        self.key = f"mooncake-store/{cluster_id}/master_view"
        self._first = 0

    def leader(self) -> Optional[Leader]:
        body = json.dumps({"key": base64.b64encode(self.key.encode()).decode()}).encode()
        last = ""
        n = len(self.endpoints)
        for i in range(n):
            at = (self._first + i) % n
            req = urllib.request.Request(
                self.endpoints[at] + "/v3/kv/range",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=LOOKUP_TIMEOUT_S) as r:
                    answer = json.load(r)
            except (OSError, ValueError) as e:
                last = f"{self.endpoints[at]}: {e}"
                continue
            self._first = at
            kvs = answer.get("kvs") or []
            if not kvs:
                return None
            kv = kvs[0]
            try:
                view = json.loads(base64.b64decode(kv.get("value", "")))
                return Leader(rpc=str(view["rpc"]), epoch=int(kv.get("create_revision", 0)))
            except (ValueError, KeyError, TypeError) as e:
                raise TransportError(self.spec, f"bad leader view in {self.key}: {e}") from None
        raise TransportError(self.spec, f"no etcd endpoint answered: {last}")


def _load_kubeconfig(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except ValueError:
        try:
            import yaml  # type: ignore
        except ImportError:
            raise ConfigError(
                f"{path}: a YAML kubeconfig needs PyYAML (pip install pyyaml), or use a JSON one"
            ) from None
        return yaml.safe_load(text)


class KubeLookup(Lookup):
    SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

    def __init__(self, spec: str, namespace: str, lease: str):
        self.spec = spec
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}"
        self._api: Optional[Tuple[str, Optional[str], Optional[ssl.SSLContext]]] = None

    def _settings(self) -> Tuple[str, Optional[str], Optional[ssl.SSLContext]]:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        if host:
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            with open(os.path.join(self.SA_DIR, "token"), encoding="utf-8") as f:
                token = f.read().strip()
            ctx = ssl.create_default_context(cafile=os.path.join(self.SA_DIR, "ca.crt"))
            return f"https://{host}:{port}", token, ctx
        path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        kc = _load_kubeconfig(path)
        current = kc.get("current-context")
        ctx_entry = next((c["context"] for c in kc.get("contexts", []) if c.get("name") == current), None)
        if ctx_entry is None and kc.get("contexts"):
            ctx_entry = kc["contexts"][0]["context"]
        if ctx_entry is None:
            raise ConfigError(f"{path}: no context")
        cluster = next(c["cluster"] for c in kc.get("clusters", []) if c.get("name") == ctx_entry["cluster"])
        user = next((u.get("user", {}) for u in kc.get("users", []) if u.get("name") == ctx_entry.get("user")), {})
        server = cluster["server"].rstrip("/")
        ctx = None
        if server.startswith("https://"):
            ctx = ssl.create_default_context()
            if cluster.get("insecure-skip-tls-verify"):
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            elif cluster.get("certificate-authority-data"):
                ctx.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        return server, user.get("token"), ctx

    def leader(self) -> Optional[Leader]:
        if self._api is None:
            self._api = self._settings()
        server, token, context = self._api
        req = urllib.request.Request(server + self.path)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=LOOKUP_TIMEOUT_S, context=context) as r:
                lease = json.load(r)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise TransportError(self.spec, f"reading the Lease: HTTP {e.code}") from None
        except (OSError, ValueError) as e:
            raise TransportError(self.spec, f"reading the Lease: {e}") from None
        spec = lease.get("spec") or {}
        if not spec.get("holderIdentity"):
            return None
        raw = ((lease.get("metadata") or {}).get("annotations") or {}).get(VIEW_ANNOTATION)
        if not raw:
            return None
        try:
            view = json.loads(raw)
            return Leader(rpc=str(view["rpc"]), epoch=int(spec.get("leaseTransitions", 0)))
        except (ValueError, KeyError, TypeError):
            return None


def parse_master(spec: str) -> Optional[Lookup]:
    """``None`` for ``host:port``; else the lookup of an elected master's leader."""
    s = spec.strip()
    if s.startswith("etcd://"):
        rest = s[len("etcd://") :]
        # The cluster id follows the last '/' (not an endpoint's http://, nor a trailing '/').
        listing, cluster = rest, ""
        head, sep, tail = rest.rpartition("/")
        if sep and not tail:
            listing = head
        elif sep and ":" not in tail and not head.endswith(("/", ":")):
            listing, cluster = head, tail
        cluster = cluster or default_cluster_id()
        if not _CLUSTER_ID.match(cluster):
            raise ConfigError(f"master {spec!r}: cluster id {cluster!r} must be letters, digits, '-', '_' or '.'")
        return EtcdLookup(spec, parse_etcd_endpoints(spec, listing), cluster)
    if s.startswith("k8s://"):
        ns, _, lease = s[len("k8s://") :].partition("/")
        for what, v in (("namespace", ns), ("lease name", lease)):
            if not v or not all(_DNS_LABEL.match(p) for p in v.split(".")):
                raise ConfigError(f"master {spec!r}: {what} {v!r} is not a valid Kubernetes name (k8s://namespace/lease)")
        return KubeLookup(spec, ns, lease)
    if "://" in s:
        raise ConfigError(
            f"master {spec!r}: unknown scheme (expected host:port, etcd://h1:2379;h2:2379 or k8s://namespace/lease)"
        )
    return None


def is_elected(spec: str) -> bool:
    s = spec.strip()
    return s.startswith("etcd://") or s.startswith("k8s://")
