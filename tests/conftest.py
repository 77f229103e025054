import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

#: ``@pytest.mark.full``: a variant of a check the suite already makes (another model of a family, another mix,
#: another route to the same numbers) — skipped unless GRAPHSIM_FULL=1 (GRAPHSIM_EXEC_FULL=1, its older name, too),
#: so that ``make test`` stays within its time budget on 2 cores while every behaviour keeps one check in it.
FULL = bool(os.environ.get("GRAPHSIM_FULL") or os.environ.get("GRAPHSIM_EXEC_FULL"))

# Property and fuzz tests draw the same examples on every run of the default budget, so that `make test` (and
# CI) passes or fails by the code alone; a larger budget (GRAPHSIM_FUZZ_EXAMPLES) explores new ones each run,
# as tests/fuzz/campaign.py does. HYPOTHESIS_PROFILE=suite|explore chooses either way.
try:
    from hypothesis import settings as _hyp

    _hyp.register_profile("suite", derandomize=True, database=None)
    _hyp.register_profile("explore")
    _hyp.load_profile(os.environ.get("HYPOTHESIS_PROFILE",
                                     "explore" if os.environ.get("GRAPHSIM_FUZZ_EXAMPLES") else "suite"))
except ImportError:  # hypothesis is a dev dependency; the suite's property tests import it themselves
    pass


def pytest_collection_modifyitems(config, items):
    # ``@pytest.mark.heavy`` (the executed-graph modules: 5-20 s per test) first, so that the parallel workers
    # end on short tests and finish together (xdist's worksteal hands out the list in order)
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)
    if FULL:
        return
    skip = pytest.mark.skip(reason="a variant of a check the suite makes: GRAPHSIM_FULL=1 runs it")
    for item in items:
        if item.get_closest_marker("full") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_local():
    """Ray, started once per test process by the first executor that needs it (graphsim's ``ray_init`` joins a
    running instance) and shut down at the end: each start costs seconds."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'graphsim[ray]'): the Ray executor "
                                            "is not tested here")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def gb200():
    from graphsim.hw import load_hw

    return load_hw("gb200")


def toy_model(layers: int, hidden: int):
    """A minimal model for hand-built graphs: the declared protocol's defaults with a layer count and a
    hidden size (what pipeline parallelism reads)."""
    from types import SimpleNamespace

    from graphsim.models.base import Model

    m = Model()
    m.name = "toy"
    m.cfg = SimpleNamespace(layers=layers, hidden=hidden)
    return m

