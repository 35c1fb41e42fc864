"""Fixtures of the Python tests (helpers: refs.py). The seed is fixed: pytest -v shows it in
no id, so it is named here: SEED."""

import numpy as np
import pytest

SEED = 29  # every test draws from default_rng(SEED)


@pytest.fixture
def rng():
    return np.random.default_rng(SEED)


# ---- files the model tests need -------------------------------------------------------------
# As tests/data_testutil.h: a missing file FAILS its test with how to get it; SPARQ_ALLOW_SKIP=1
# (never under CI=true) turns that into a skip.

import os  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def require_file(path, what_and_how):
    if path and os.path.exists(path):
        return path
    msg = f"{what_and_how} (missing: {path})"
    if os.environ.get("SPARQ_ALLOW_SKIP") == "1" and os.environ.get("CI") != "true":
        pytest.skip(msg)
    pytest.fail(msg + " (SPARQ_ALLOW_SKIP=1 turns this failure into a skip)", pytrace=False)


@pytest.fixture(scope="session")
def sparq_cli():
    """The `sparq` command line, the independent reference of the model tests: $SPARQ_CLI, else
    the release tree's build/release/sparq (scripts/run_tests.sh builds it)."""
    path = os.environ.get("SPARQ_CLI") or os.path.join(REPO, "build", "release", "sparq")
    return require_file(path, "the sparq command line: build it (cmake --build build/release "
                              "--target sparq_cli) or set SPARQ_CLI to its path")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from tiny_model import write_tiny_model
    return write_tiny_model(str(tmp_path_factory.mktemp("tiny") / "tiny-llama"))


@pytest.fixture(scope="session")
def sherlock():
    path = os.path.join(REPO, "data", "text", "sherlock-holmes-pg1661.txt")
    return require_file(path, "part of the repository (data/text/): git checkout -- data/text")


def smollm2_path():
    """Where tests/data_testutil.h looks for SmolLM2-135M-Instruct (Q4_1 GGUF)."""
    for var in ("SPARQ_MODEL", "SPARQ_SMOLLM2_GGUF"):
        if os.environ.get(var):
            return os.environ[var]
    cache = os.environ.get("SPARQ_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                           "sparq")
    return os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


# ---- the torch tier --------------------------------------------------------------------------
# Tests marked `torch` need PyTorch. Without it they are deselected (counted as "deselected" in
# pytest's summary line), never skipped: scripts/run_tests.sh counts a skip as an error, and a
# run without torch must stay green. docs/python.md ("Running the torch tests") says how to get it.

def _torch_importable():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def pytest_collection_modifyitems(config, items):
    if not any(item.get_closest_marker("torch") for item in items) or _torch_importable():
        return
    keep = [item for item in items if not item.get_closest_marker("torch")]
    dropped = [item for item in items if item.get_closest_marker("torch")]
    config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def pytest_report_header(config):
    return "torch: " + ("importable, the torch tests run" if _torch_importable() else
                        "not importable, the torch-marked tests are deselected")
