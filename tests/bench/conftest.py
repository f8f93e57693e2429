"""Shared by the benchmark tests."""
import os

import pytest


@pytest.fixture(autouse=True, scope="module")
def _restore_threads():
    """The benchmark fixes thread counts and variables process-wide; give the other tests
    theirs back (every module of this folder)."""
    import tvm

    env = dict(os.environ)
    tvm_threads = tvm.get_global_func("runtime.NumThreads")()
    try:
        import torch

        torch_threads = torch.get_num_threads()
    except ImportError:
        torch, torch_threads = None, None
    yield
    os.environ.clear()
    os.environ.update(env)
    tvm.get_global_func("runtime.config_threadpool")(0, tvm_threads)
    if torch is not None:
        torch.set_num_threads(torch_threads)
