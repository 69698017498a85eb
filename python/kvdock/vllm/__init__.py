"""kvdock inside vLLM: the KV connector v1 (``KvdockConnector``).

    --kv-transfer-config '{"kv_connector": "KvdockConnector",
                           "kv_connector_module_path": "kvdock.vllm",
                           "kv_role": "kv_both"}'

vLLM's factory imports this module and takes ``KvdockConnector`` from it.
Importable without vLLM (the base classes are then restated in ``_base``)
and without a daemon (nothing connects before vLLM builds the connector).
"""

from ._base import HAVE_VLLM
from .connector import VLLM_BASE_COMMIT, KvdockConnector, KvdockConnectorMetadata

__all__ = ["KvdockConnector", "KvdockConnectorMetadata", "HAVE_VLLM", "VLLM_BASE_COMMIT"]
