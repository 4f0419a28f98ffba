import compileall
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "jobs"))

from fleethelpers import WorkerProcess  # noqa: E402
from helpers import STARTED, DaemonProcess, Gate  # noqa: E402

# PostgreSQL databases and schemas for the tests that need them; a central daemon and the
# link to it for the forwarding tests.
pytest_plugins = ["pgfixtures", "forwardhelpers"]

ROOT = Path(__file__).parent.parent


def pytest_configure(config):
    """Compile the package and the tests' job modules once, before the run. The tests start
    some 650 daemons, workers, zygotes and CLI processes; where the environment sets
    PYTHONDONTWRITEBYTECODE, each of them would compile every module it imports from
    source (~250 ms of a daemon's ~620 ms start). Once, in the controller: the workers find
    the bytecode already written."""
    if not hasattr(config, "workerinput"):
        for folder in (ROOT / "queickd", ROOT / "tests" / "jobs"):
            compileall.compile_dir(folder, quiet=1)
    config.addinivalue_line("markers", "long: a test that waits on real time for minutes; run first")


def pytest_collection_modifyitems(config, items):
    """Long tests first: each mostly waits, so one begun at the start overlaps the rest of
    the run on its worker's neighbours instead of ending it alone."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(autouse=True)
def _no_daemon_outlives_its_test():
    yield
    while STARTED:
        STARTED.pop().close()


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'queue.db'}"


@pytest.fixture
def start_daemon(tmp_path):
    """Start real daemons (subprocesses on free ports); all are killed at the end."""
    started: list[DaemonProcess] = []

    def start(store_url: str | None = None, *extra: str, **kw) -> DaemonProcess:
        d = DaemonProcess(store_url or f"sqlite:///{tmp_path / 'queue.db'}", *extra, **kw).start()
        started.append(d)
        return d

    yield start
    for d in started:
        d.close()


@pytest.fixture
def daemon(start_daemon):
    """A daemon on a fresh SQLite store (full durability) with 4 workers."""
    return start_daemon()


@pytest.fixture
def client(daemon):
    with daemon.client() as q:
        yield q


@pytest.fixture
def gate():
    g = Gate()
    yield g
    g.close()


@pytest.fixture
def start_worker():
    """start_worker(url, *pools, **kw): a `queick worker` process, closed after the test."""
    started: list[WorkerProcess] = []

    def start(url: str, *pools: str, **kw) -> WorkerProcess:
        w = WorkerProcess(url, *pools, **kw).start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()
