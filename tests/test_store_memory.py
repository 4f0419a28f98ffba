import pytest
from store_contract import StoreContract

from queickd.store import open_store
from queickd.store.memory.store import MemoryStore


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self):
        return MemoryStore()


def test_memory_url_opens_a_memory_store():
    assert isinstance(open_store("memory://"), MemoryStore)
