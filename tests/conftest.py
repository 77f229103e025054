import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")


@pytest.fixture(scope="session")
def gb200():
    from graphsim.hw import load_hw

    return load_hw("gb200")
