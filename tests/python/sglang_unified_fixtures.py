"""The fixture both unified-linker test files use: adapters over linkers
of the test's daemon, closed at teardown."""

import pytest

from kvdock.sglang.unified import KvdockUnifiedCacheLinker
from mini_engine import UnifiedLinkerFlow


@pytest.fixture
def unified_factory(daemon, linker_factory):
    """make(engine, **linker_cfg) -> (adapter, flow) on the test's daemon."""
    made = []

    def make(engine, model_id="unified-test", **cfg):
        lk = linker_factory(daemon, model_id=model_id, **cfg)
        a = KvdockUnifiedCacheLinker(device_pools=engine.device_pools(), linker=lk)
        made.append(a)
        return a, UnifiedLinkerFlow(engine, a)

    yield make
    for a in made:
        a.close()
