"""topi_bn.testing.workloads_module: several registry workloads in one module, built by one
compile and called by name (what the GPU tests use to build every workload with one nvcc run),
checked here on the CPU."""
import tvm

from topi_bn import workloads as W
from topi_bn.schedules import rules
from topi_bn.targets import resolve_target
from topi_bn.testing import assert_close, run_workload, workload_symbol, workloads_module


def test_each_workload_of_one_module_runs_by_name():
    target = resolve_target("llvm")
    names = [w.name for w in W.list_workloads("smoke")]
    lib = tvm.compile(rules.apply_default_schedules(workloads_module(names, "float32"), target),
                      target=target)
    for name in names:
        got, expect = run_workload(lib, W.get(name), "float32", seed=3,
                                   func_name=workload_symbol(name))
        for i, (g, e) in enumerate(zip(got, expect)):
            assert_close(g, e, "float32", name=f"{name} output {i}")


def test_workload_symbol_is_a_c_identifier():
    assert workload_symbol("resnet50.conv3x3_64_64_56_s1_relu") == \
        "resnet50_conv3x3_64_64_56_s1_relu"
