"""The vLLM KV-connector v1 base classes the kvdock connector builds on.

With vLLM installed, this module re-exports vLLM's own classes
(``vllm.distributed.kv_transfer.kv_connector.v1.base``).  Without it (tests,
tools, a host that only inspects the store) it restates them: the same class
names, method names and signatures, with do-nothing defaults, so that
``kvdock.vllm`` imports anywhere and a connector written against the
restatement fits the real interface.

Restated from vLLM's main branch, ``kv_connector/v1/base.py`` at commit
003df2961dd8830c317a61f9745ccd557da9fa06 (the KVConnectorBase_V1 with
``__init__(vllm_config, role, kv_cache_config)``, ``SupportsHMA`` with
``request_finished_all_groups``, ``get_block_ids_with_load_errors``,
``handle_preemptions``, ``build_connector_worker_meta``).  The tests restate
the interface once more, independently, and compare signatures.

``HAVE_VLLM`` says which of the two this module holds.
"""

import enum
from abc import ABC, abstractmethod

try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: F401
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
        KVConnectorWorkerMetadata,
        SupportsHMA,
        supports_hma,
    )

    HAVE_VLLM = True
except Exception:  # ImportError, or a vLLM too old to have these names
    HAVE_VLLM = False

    class SupportsHMA(ABC):
        """Marks a connector that works with vLLM's hybrid memory allocator
        (several KV cache groups, one block table each)."""

        @abstractmethod
        def request_finished_all_groups(self, request, block_ids):
            """Once per finished request, before its blocks of every group
            are freed; block_ids holds one list per KV cache group. Returns
            (free later?, kv transfer params)."""
            raise NotImplementedError

    def supports_hma(connector):
        if isinstance(connector, type):
            return issubclass(connector, SupportsHMA)
        return isinstance(connector, SupportsHMA)

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0  # the connector inside the scheduler process
        WORKER = 1  # the connector inside each worker process

    class KVConnectorMetadata(ABC):  # noqa: B024 - a marker, as in vLLM
        """What the scheduler-side connector hands the worker-side
        connectors for one step."""

    class KVConnectorWorkerMetadata(ABC):
        """What each worker-side connector hands back to the scheduler
        side for one step; merged with ``aggregate``."""

        @abstractmethod
        def aggregate(self, other):
            pass

    class KVConnectorBase_V1(ABC):
        """Restatement of vLLM's KVConnectorBase_V1 (see the module
        docstring for the version)."""

        @property
        def prefer_cross_layer_blocks(self):
            return False

        @property
        def supports_eagle_prefix_cache_hashing(self):
            return False

        @property
        def requires_kv_delivery(self):
            return bool(getattr(self._kv_transfer_config, "is_kv_producer", False))

        def __init__(self, vllm_config, role, kv_cache_config):
            self._connector_metadata = None
            self._vllm_config = vllm_config
            if getattr(vllm_config, "kv_transfer_config", None) is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role
            self.use_eagle_prefix_cache_hashing = False

        def set_eagle_prefix_cache_hashing(self, enabled):
            self.use_eagle_prefix_cache_hashing = enabled

        @property
        def role(self):
            return self._role

        # ---------------------------------------------------- worker side

        def bind_connector_metadata(self, connector_metadata):
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self):
            return self._connector_metadata is not None

        def register_kv_caches(self, kv_caches):
            return

        def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
            return

        def set_host_xfer_buffer_ops(self, copy_operation):
            return

        def handle_preemptions(self, kv_connector_metadata):
            return

        @abstractmethod
        def start_load_kv(self, forward_context, **kwargs):
            pass

        @abstractmethod
        def wait_for_layer_load(self, layer_name):
            pass

        @abstractmethod
        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
            pass

        @abstractmethod
        def wait_for_save(self):
            pass

        def get_finished(self, finished_req_ids):
            return None, None

        def get_block_ids_with_load_errors(self):
            return set()

        def shutdown(self):
            return None

        def get_kv_connector_stats(self):
            return None

        def get_kv_connector_kv_cache_events(self):
            return None

        def get_handshake_metadata(self):
            return None

        def build_connector_worker_meta(self):
            return None

        # ------------------------------------------------- scheduler side

        def bind_gpu_block_pool(self, gpu_block_pool):
            return

        @abstractmethod
        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            pass

        @abstractmethod
        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            pass

        @abstractmethod
        def build_connector_meta(self, scheduler_output):
            pass

        def on_new_request(self, request):
            return

        def update_connector_output(self, connector_output):
            return

        def request_finished(self, request, block_ids):
            return False, None

        def take_events(self):
            return ()

        def has_pending_push_work(self):
            return False

        @classmethod
        def get_required_kvcache_layout(cls, vllm_config):
            if cls is KVConnectorBase_V1:
                raise TypeError("get_required_kvcache_layout should not be called "
                                "on the abstract base class")
            return None

        @classmethod
        def requires_piecewise_for_cudagraph(cls, extra_config):
            return False

        def get_finished_count(self):
            return None

        @classmethod
        def build_kv_connector_stats(cls, data=None):
            return None

        def set_xfer_handshake_metadata(self, metadata):
            return None

        def set_xfer_handshake_metadata_pp_aware(self, metadata):
            if any(pp_rank != 0 for pp_rank, _ in metadata):
                raise ValueError("%s got handshake metadata of pp_rank > 0" % type(self).__name__)
            self.set_xfer_handshake_metadata(
                {tp_rank: meta for (_, tp_rank), meta in metadata.items()})

        @classmethod
        def build_prom_metrics(cls, vllm_config, metric_types, labelnames,
                               per_engine_labelvalues):
            return None

        def reset_cache(self):
            return None
