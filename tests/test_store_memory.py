import pytest
from store_contract import StoreContract

from queickd.store import open_store
from queickd.store.sqlite.store import SQLiteStore


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self):
        return open_store("memory://")


def test_memory_url_opens_a_memory_store():
    store = open_store("memory://")
    assert isinstance(store, SQLiteStore) and store.url == "memory://"
