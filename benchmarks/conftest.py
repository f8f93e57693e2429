"""pytest-benchmark suites of topi-bn (``pytest benchmarks``).

The files here are named ``bench_*.py``; this conftest collects them. Every case runs in this
process with the thread count fixed once (:func:`topi_bn.bench.set_threads`) and the inputs of
:meth:`Workload.random_inputs`.

Modes:

- default: the ``--quick`` workloads of ``topi-bn bench``
  (:data:`topi_bn.bench.QUICK_WORKLOADS`), or ``--bench-group resnet50`` (repeatable) for a
  whole workload group;
- smoke (``--bench-smoke``, ``TOPI_BN_BENCH_SMOKE=1`` or ``--benchmark-disable``): the tiny
  ``smoke`` workloads, one round, no whole networks beyond a tiny one — what CI runs so the
  suites cannot rot.

Options: ``--bench-target`` (default ``x86``), ``--bench-threads`` (default: all cores),
``--bench-rounds``.
"""
from __future__ import annotations

import os

# Before anything imports tvm (which imports torch, which loads OpenMP): idle threads wait
# passively and TVM pins no thread (see topi_bn.bench.set_threads). Values already set win.
for _k, _v in (("OMP_WAIT_POLICY", "PASSIVE"), ("TVM_THREAD_POOL_SPIN_COUNT", "0"),
               ("TVM_BIND_THREADS", "0")):
    os.environ.setdefault(_k, _v)

import pytest  # noqa: E402


def pytest_addoption(parser):
    g = parser.getgroup("topi-bn benchmarks")
    g.addoption("--bench-smoke", action="store_true", default=False,
                help="tiny 'smoke' workloads, one round (also TOPI_BN_BENCH_SMOKE=1 or "
                     "--benchmark-disable)")
    g.addoption("--bench-group", action="append", default=None,
                help="workload group(s) to run instead of the quick set")
    g.addoption("--bench-target", default="x86", help="CPU target (default x86)")
    g.addoption("--bench-threads", type=int, default=0, help="threads (default: all cores)")
    g.addoption("--bench-rounds", type=int, default=None, help="rounds per case")


def pytest_configure(config):
    """Fix the thread count (and passive waiting) before anything loads PyTorch."""
    from topi_bn import bench

    config._topi_bn_threads = bench.set_threads(config.getoption("--bench-threads"))
    config._topi_bn_smoke = smoke_mode(config)


def pytest_collect_file(file_path, parent):
    # a file named on the command line is collected by pytest itself
    if file_path.name.startswith("bench_") and file_path.suffix == ".py" \
            and not parent.session.isinitpath(file_path):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def smoke_mode(config) -> bool:
    disabled = False
    try:
        disabled = bool(config.getoption("benchmark_disable"))
    except ValueError:  # pytest-benchmark not installed
        pass
    return (config.getoption("--bench-smoke") or disabled
            or os.environ.get("TOPI_BN_BENCH_SMOKE", "") not in ("", "0"))


def _workloads(config):
    from topi_bn import bench

    if smoke_mode(config):
        return bench.select_workloads(["smoke"])
    return bench.select_workloads(config.getoption("--bench-group"),
                                  quick=not config.getoption("--bench-group"))


def pytest_generate_tests(metafunc):
    from topi_bn import bench

    if "workload" in metafunc.fixturenames:
        wls = _workloads(metafunc.config)
        metafunc.parametrize("workload", wls, ids=[w.name for w in wls])
    if "impl" in metafunc.fixturenames:
        names = [i.name for i in bench.IMPLEMENTATIONS]
        metafunc.parametrize("impl", names, ids=[n.replace(" ", "-") for n in names])


@pytest.fixture(scope="session")
def bench_cfg(pytestconfig):
    """The :class:`topi_bn.bench.BenchConfig` of this session; threads fixed once."""
    from topi_bn import bench

    make = bench.BenchConfig.smoke if smoke_mode(pytestconfig) else bench.BenchConfig.quick
    changes = {"target": pytestconfig.getoption("--bench-target")}
    if pytestconfig.getoption("--bench-rounds"):
        changes["rounds"] = pytestconfig.getoption("--bench-rounds")
    return make(threads=pytestconfig._topi_bn_threads, **changes)


@pytest.fixture(scope="session")
def bench_target(bench_cfg):
    from topi_bn import bench

    return bench.resolve_bench_target(bench_cfg.target, bench_cfg.threads)


@pytest.fixture(scope="session")
def smoke(pytestconfig) -> bool:
    return smoke_mode(pytestconfig)


@pytest.fixture
def run_case(benchmark, bench_cfg):
    """``run_case(prepared, group, **extra_info)`` times ``prepared.run`` with ``benchmark.pedantic``:
    one warm-up round, ``rounds`` rounds of ``iterations`` calls, ``iterations`` chosen as
    :func:`topi_bn.bench.time_callable` does (a round lasts at least ``min_round_ms``)."""
    from topi_bn import bench

    def run(prepared, group: str, **extra):
        probe = bench.time_callable(prepared.run, rounds=1, min_round_ms=bench_cfg.min_round_ms)
        benchmark.group = group  # one table per workload / network
        benchmark.extra_info.update(extra)
        benchmark.pedantic(prepared.run, rounds=bench_cfg.rounds, iterations=probe.number,
                           warmup_rounds=1)
    return run
