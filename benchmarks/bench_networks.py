"""Whole-network benchmarks: ResNet-18, ResNet-50 and MobileNetV2 (224x224, batch 1), each
imported through torch.export and ONNX and built per ``bn`` mode of ``topi_bn.build``, against
PyTorch eager and ONNX Runtime (:mod:`topi_bn.bench.networks`).

In smoke mode only the tiny network of :func:`topi_bn.bench.networks.tiny_network` runs.
Every case first checks its output against PyTorch eager.
"""
from functools import lru_cache

import numpy as np
import pytest

from topi_bn.bench import Unavailable
from topi_bn.bench import networks as nb


def _networks(config):
    if config._topi_bn_smoke:  # set by benchmarks/conftest.py
        return [nb.tiny_network()]
    try:
        return nb.default_networks()
    except Unavailable as err:
        return [pytest.param(None, marks=pytest.mark.skip(reason=str(err)), id="networks")]


def pytest_generate_tests(metafunc):
    if "network" in metafunc.fixturenames:
        nets = _networks(metafunc.config)
        metafunc.parametrize("network", nets,
                             ids=[getattr(n, "name", None) or "networks" for n in nets])
    if "net_impl" in metafunc.fixturenames:
        names = nb.network_impl_names()
        metafunc.parametrize("net_impl", names, ids=[n.replace(" ", "-") for n in names])


@lru_cache(maxsize=4)
def _model_input_reference(net: nb.Network):
    import torch

    torch.manual_seed(0)
    model = net.make().eval()
    x = np.random.default_rng(0).standard_normal(net.input_shape).astype("float32")
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    return model, x, ref


def test_network(network, net_impl, bench_cfg, bench_target, run_case):
    pytest.importorskip("torch")
    model, x, ref = _model_input_reference(network)
    try:
        prepared = nb.prepare_network(net_impl, network, bench_target, bench_cfg.threads,
                                      model, x)
    except Unavailable as err:
        pytest.skip(str(err))
    prepared.run()
    assert nb.check_network_output(prepared.output(), ref,
                                   dtype=prepared.precision or None) == "ok"
    run_case(prepared, network.name, impl=net_impl, network=network.name, note=prepared.note,
             build_s=prepared.build_s, **{k: v for k, v in prepared.info.items()
                                          if isinstance(v, (int, float, str))})
