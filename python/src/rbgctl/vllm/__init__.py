"""vLLM on the rbgctl pool: ``RbgctlConnector``, a KV connector (vLLM's API v1, 0.33).

vLLM loads it by module path::

    vllm serve <model> --kv-transfer-config '{"kv_connector": "RbgctlConnector",
        "kv_connector_module_path": "rbgctl.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"master": "10.0.0.1:50051"}}'

The extra config takes the client's settings (``rbgctl.config.ClientConfig``) and the
connector's own (``connector.Settings``). Each full block of the KV cache is one object of the
pool, named by vLLM's chained block hash and what else changes its bytes (``keys``); engines
with the same model and configuration share blocks. docs/vllm.md has the details.

The connector class is imported on first use (it needs vLLM and torch); ``keys``, ``layout`` and
``plan`` are plain Python.
"""

from typing import Any

__all__ = ["RbgctlConnector"]


def __getattr__(name: str) -> Any:
    if name in ("RbgctlConnector", "RbgctlMetadata"):
        from . import connector

        return getattr(connector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
