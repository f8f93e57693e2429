"""Op-level benchmarks: every implementation of :data:`topi_bn.bench.ops.IMPLEMENTATIONS` on
every selected workload (conv2d+BN+act incl. depthwise, training batch_norm, layer_norm).

Each case checks its output against the float64 reference once, then is timed with
``benchmark.pedantic``. Implementations that cannot run here (no ``topi_bn.build`` yet, ONNX
has no channels-last BatchNormalization, a peer is not installed) are skipped with the reason.
"""
from functools import lru_cache

import pytest

from topi_bn import bench
from topi_bn import workloads as W


@lru_cache(maxsize=8)
def _inputs_and_reference(name: str):
    wl = W.get(name)
    arrays = wl.random_inputs()
    return arrays, wl.reference(*arrays)[0]


def test_op(workload, impl, bench_cfg, bench_target, run_case):
    arrays, ref = _inputs_and_reference(workload.name)
    try:
        prepared = bench.prepare(impl, workload, bench_target, bench_cfg.threads, arrays)
    except bench.Unavailable as err:
        pytest.skip(str(err))
    prepared.run()
    assert bench.check_output(workload, prepared.output(), ref,
                              dtype=prepared.precision or "float32") == "ok"
    fam = bench.OP_FAMILIES[workload.op]
    run_case(prepared, workload.name, op=workload.op, impl=impl, unit=fam.unit,
             flops=workload.flops, bytes=workload.bytes_moved(), note=prepared.note,
             build_s=prepared.build_s)
