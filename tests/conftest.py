import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")


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
