"""Fixtures of the Python tests (helpers: refs.py). The seed is fixed: pytest -v shows it in
no id, so it is named here: SEED."""

import numpy as np
import pytest

SEED = 29  # every test draws from default_rng(SEED)


@pytest.fixture
def rng():
    return np.random.default_rng(SEED)
