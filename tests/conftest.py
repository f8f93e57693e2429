import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_collection_modifyitems(config, items):
    """GPU tests need an NVIDIA device; skip them with the reason where there is none."""
    try:
        import tvm

        has_gpu = tvm.cuda(0).exist
    except Exception:  # no CUDA runtime at all
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (tvm.cuda(0).exist is False here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
