"""``topi-bn tune``: MetaSchedule tuning of registry workloads into a JSON database.

Two search spaces, as AutoTVM and Ansor were:

- ``template``: our schedule rules with their knobs sampled
  (:func:`topi_bn.schedules.rules.template_space`);
- ``auto``: the blocks without our rule annotation (:func:`~topi_bn.schedules.common.strip_rules`),
  searched by MetaSchedule's generic rules (``post-order-apply``).

Each workload is tuned into a private in-memory database, then its records are merged into the
shared log directory under a file lock (:mod:`topi_bn.tuning_db`). Records are keyed by the
PrimFunc exactly as a Relax build sees it (:func:`workload_prim_func`), so
``MetaScheduleApplyDatabase`` finds them. A rerun skips the workloads whose trial budget is met
(the log's ``topi_bn_tuning.json`` manifest says how many trials each has had).

Every tuned workload also gets a record of its default schedule (what an untuned build runs),
measured by the same builder and runner (:func:`default_record`): a build takes the fastest
record, so a tuned build is never slower than the default as measured while tuning.
"""
# Long because: the tuning loop: selection, progress, manifest, measurement, default record.
from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Sequence, TextIO

from . import rpc, workloads as _workloads
from .checks import check_choice, check_writable_dir, describe
from .relax import lowering
from .relax.bf16_rounding import native_bf16_rounding
from .rpc import parse_tracker
from .schedules import schedule_function, strip_rules, template_space
from .schedules.cpu_conv_dpbf16 import native_dpbf16
from .schedules.rules import rules_for
from .targets import resolve, resolve_target, target_family, tuning_log_key, vector_lanes
from .tuning_db import build_visible_mod, merge_records, read_manifest, tuning_scope

__all__ = ["SPACES", "DTYPES", "TuneConfig", "TuneResult", "tune", "workload_prim_func",
           "select_workloads", "build_visible_mod", "default_record", "progress_stream",
           "import_tensor_intrinsics"]

SPACES = ("template", "auto")
#: Element types ``tune`` tunes for.
DTYPES = ("float32", "float16", "bfloat16")

logger = logging.getLogger("topi_bn")


@dataclass
class TuneConfig:
    """Knobs of a tuning run that are not the workload list.

    Attributes
    ----------
    trials_per_iter : int or None
        Candidates per search round; default ``min(trials, 16)``.
    builder_timeout_s, runner_timeout_s : float
        Per-candidate limits of the local builder and runner (generous: a loaded 2-core machine
        needs tens of seconds to compile a candidate).
    num_cores : int or None
        Parallel build/measure workers; default: the target's ``num-cores``.
    seed : int or None
        Seed of the search.
    flush_caches : bool
        Local CPU runner: time each candidate with the caches flushed before every call except
        of the data input, as kernels run in a network (weights cold, the input warm from the
        previous kernel), ``runner_calls`` single calls; as ``topi-bn tune --verify`` times
        (:func:`topi_bn.tuning_verify.interleaved_us`). False: MetaSchedule's default
        (back-to-back calls for at least 100 ms, warm caches).
    runner_calls : int
        Flushed calls per candidate.
    population : int or None
        Evolutionary search population; default ``min(512, max(64, 32 * trials))``:
        MetaSchedule's 512 from 16 trials up, fewer candidates sampled and mutated per round
        for a smaller budget (a 2-trial tune spent 40% of its time there).
    """

    trials_per_iter: int | None = None
    builder_timeout_s: float = 300.0
    runner_timeout_s: float = 120.0
    num_cores: int | None = None
    seed: int | None = 0
    flush_caches: bool = True
    runner_calls: int = 10
    population: int | None = None

    def population_for(self, trials: int) -> int:
        return self.population or min(512, max(64, 32 * trials))


@dataclass
class TuneResult:
    """What happened to one workload."""

    workload: str
    status: str  # "tuned" | "skipped"
    trials: int = 0  # trials measured by this run
    best_us: float | None = None
    records_in_log: int = 0
    metric: str = ""  # "12.3 GFLOP/s" of the best candidate this run found
    extra: dict = field(default_factory=dict)


# -- the PrimFunc a build sees ------------------------------------------------------------------
def _relax_module(workload, dtype: str):
    from tvm import relax

    bb = relax.BlockBuilder()
    params = [relax.Var(name, relax.TensorType(shape, dt))
              for (name, shape), dt in zip(workload.shapes.items(), workload.arg_dtypes(dtype))]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_te(lambda *args: workload.compute(*args), *params,
                             primfunc_name_hint=workload.op)
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def fuse_passes():
    """The passes a Relax build runs before it applies tuning records (as MetaSchedule's
    ``compile_relax`` does); :mod:`topi_bn.build` uses the same list."""
    from tvm import relax

    return [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]


def workload_prim_func(workload, dtype: str = "float32", target=None):
    """The PrimFunc of ``workload`` exactly as a Relax build sees it when it applies records.

    The compute is emitted with ``relax.BlockBuilder.emit_te`` (int64 shapes) and taken through
    :func:`fuse_passes` (which add the ``op_pattern`` attribute). ``te.create_prim_func`` of the
    same compute has int32 shapes and no attributes, is not structurally equal, and would never
    match a record.

    Parameters
    ----------
    workload : Workload or str
        A registry workload or its name.
    dtype : str
        Element type of the build: every input's, except in ``bfloat16``, whose batch-norm
        parameters (and Winograd weights) a bf16 build keeps in float32
        (:meth:`topi_bn.workloads.Workload.arg_dtypes`).
    target : optional
        Target made current while the passes run (``x86`` when None).
    """
    import tvm

    if isinstance(workload, str):
        workload = _workloads.get(workload)
    if not isinstance(workload, _workloads.Workload):
        raise TypeError(f"workload: expected a Workload or a workload name, got "
                        f"{describe(workload)}")
    dtype = check_choice("dtype", dtype, DTYPES + ("float64",))
    workload.arg_dtypes(dtype)  # a pair kernel in another dtype: ValueError naming dtype
    mod = _relax_module(workload, dtype)
    with resolve_target(target if target is not None else "x86"):
        mod = tvm.transform.Sequential(fuse_passes())(mod)
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    if len(funcs) != 1:
        raise RuntimeError(f"workload {workload.name}: expected one PrimFunc, got {len(funcs)}")
    return funcs[0]


# -- arguments ------------------------------------------------------------------------------------
def select_workloads(spec, target=None, dtype: str = "float32") -> list:
    """Workloads named by ``spec``: a group (``topi_bn.workloads.groups()``), ``"all"``, a
    comma-separated list of workload names, or a sequence of names/Workloads.

    With a CPU ``target``, a network group (``resnet18``, ``resnet50``, ``mobilenetv2``) or
    ``"all"`` also brings the blocked-layout kernels a CPU build of the network runs, for the
    target's block size (its fp32 lanes: ``resnet50-nchw8c`` for AVX2) and its Winograd kernels
    (``resnet50-nchw8c-winograd``), after the NCHW ones; in ``bfloat16`` on a target with
    AVX512_BF16, the ``vdpbf16ps`` pair kernels (``resnet50-nchw16c-dpbf16``) instead of the
    blocked and Winograd kernels they replace, and the network's last conv with its float32
    output (``...dpbf16.f32``). The ``bn="folded"`` kernels are their own groups
    (``resnet50-nchw8c-folded``, ``resnet50-nchw8c-winograd-folded``)."""
    if isinstance(spec, _workloads.Workload):
        return [spec]
    if isinstance(spec, str):
        spec = spec.strip()
        if spec == "all" or spec in _workloads.groups():
            return _workloads.list_workloads(spec) + _blocked_for(spec, target, dtype)
        names = [s.strip() for s in spec.split(",") if s.strip()]
    elif isinstance(spec, Sequence):
        names = list(spec)
    else:
        raise TypeError(f"workloads: expected a group name, 'all', a comma-separated list or a "
                        f"list of workload names, got {type(spec).__name__}")
    if not names:
        raise ValueError("workloads: empty selection")
    out = []
    for n in names:
        if isinstance(n, _workloads.Workload):
            out.append(n)
            continue
        try:
            out.append(_workloads.get(n))
        except ValueError:
            raise ValueError(
                f"workloads: unknown workload or group {n!r}; groups are "
                f"{_workloads.describe_groups()}; names are listed by "
                f"topi_bn.workloads.list_workloads()") from None
    return out


def _blocked_for(group: str, target, dtype: str) -> list:
    """The blocked-layout workloads that go with ``group`` on CPU ``target`` in ``dtype`` (none
    for other groups and targets)."""
    networks = _workloads.NETWORKS if group == "all" else (group,)
    if target is None or not set(networks) <= set(_workloads.NETWORKS):
        return []
    tgt = resolve(target)
    if target_family(tgt) == "cuda":
        return []
    lanes = vector_lanes(tgt, "float32")
    if lanes not in _workloads.BLOCK_SIZES:
        return []
    direct = [w for g in _workloads.blocked_groups(lanes, networks=networks)
              for w in _workloads.list_workloads(g)]
    winograd = [w for g in _workloads.blocked_groups(lanes, networks=networks, winograd=True)
                for w in _workloads.list_workloads(g)]
    if dtype != "bfloat16" or not native_dpbf16(tgt.target):
        return direct + winograd
    # a bf16 build on AVX512_BF16 runs the pair kernel wherever it applies (every Winograd
    # layer has a pair twin); the 3x3 stride-1 convs it runs by Winograd with vdpbf16ps
    # products (schedules/cpu_conv_winograd.py) have no knobs to tune: their register tile is
    # the compute's padding of the tiles
    pairs = [_workloads.pair_twin(w) for w in direct]
    # and the last conv of each network again, with the float32 output (and residual) a bf16
    # build gives it for the pooling it feeds
    last = [w for g in _workloads.blocked_groups(lanes, networks=networks, dpbf16=True)
            for w in _workloads.list_workloads(g) if w.params.get("out_dtype") == "float32"]
    return [_workloads.get(p.name) if p else w for p, w in zip(pairs, direct)] + last


def _check_trials(trials) -> int:
    if isinstance(trials, bool) or not isinstance(trials, int):
        raise TypeError(f"trials: expected a positive int, got {type(trials).__name__}")
    if trials < 1:
        raise ValueError(f"trials: expected a positive int, got {trials}")
    return trials


# -- progress -------------------------------------------------------------------------------------
def progress_stream(progress) -> TextIO | None:
    """Where progress lines go: True -> stderr, False/None -> nowhere, or the text stream given
    (TypeError naming ``progress`` otherwise)."""
    if progress is True:
        return sys.stderr
    if progress is False or progress is None:
        return None
    if not callable(getattr(progress, "write", None)):
        raise TypeError(f"progress: expected a bool, None or a text stream, got "
                        f"{describe(progress)}")
    return progress


def _fmt_secs(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class _Progress:
    """Plain-text progress on stderr: trials done, best GFLOP/s or GB/s, time left."""

    def __init__(self, total_trials: int, stream: TextIO | None):
        self.total = total_trials
        self.done = 0
        self.stream = stream
        self.start = time.monotonic()

    def metric(self, workload, secs: float, dtype: str) -> str:
        if workload.op in _workloads.CONV_OPS:
            return f"{workload.flops / secs / 1e9:.1f} GFLOP/s"
        return f"{workload.bytes_moved(dtype) / secs / 1e9:.1f} GB/s"

    def update(self, label: str, w_done: int, w_total: int, best: str) -> None:
        if self.stream is None:
            return
        elapsed = time.monotonic() - self.start
        left = (elapsed / self.done * (self.total - self.done)) if self.done else float("nan")
        left_s = _fmt_secs(left) if self.done else "?"
        pct = 100 * self.done // max(self.total, 1)
        self.stream.write(f"[{pct:3d}%] {label}: trials {w_done}/{w_total} | best {best} | "
                          f"elapsed {_fmt_secs(elapsed)} | left ~{left_s}\n")
        self.stream.flush()


def _make_callback(progress: _Progress, workload, label: str, budget: int, dtype: str,
                   state: dict):
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class ProgressCallback(PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
                  runner_results):
            for res in runner_results:
                secs = [float(s) for s in (res.run_secs or [])]
                if secs and res.error_msg is None:
                    t = sum(secs) / len(secs)
                    if t < 1e9 and (state["best"] is None or t < state["best"]):
                        state["best"] = t
            n = len(measure_candidates)
            state["trials"] += n
            progress.done += n
            best = "-" if state["best"] is None else progress.metric(workload, state["best"], dtype)
            progress.update(label, state["trials"], budget, best)

    return ProgressCallback()


# -- tuning ------------------------------------------------------------------------------------
def _manifest_key(workload, dtype: str, space: str, target, mod) -> str:
    """``workload|dtype|space|scope|PrimFunc hash``: trials under this key count as done for
    ``target``. The scope is :func:`~topi_bn.tuning_db.tuning_scope`: a Zen 5's trials do not
    count as a Zen 4's (``x86-avx512`` and ``x86-avx512@dp256``), whose builds prefer records
    timed on their own vector pipes."""
    import tvm_ffi

    return (f"{workload.name}|{dtype}|{space}|{tuning_scope(target)}|"
            f"{tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFF:x}")


class _QuietMetaSchedule:
    """Send MetaSchedule's chatty logs to a file in the private work dir while tuning."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        lg = logging.getLogger("tvm.s_tir.meta_schedule")
        self.saved = (lg.handlers[:], lg.propagate, lg.level)
        self.handler = logging.FileHandler(self.path)
        self.handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
        lg.handlers = [self.handler]
        lg.propagate = False
        lg.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        lg = logging.getLogger("tvm.s_tir.meta_schedule")
        lg.handlers, lg.propagate, lg.level = self.saved
        self.handler.close()


def import_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (MetaSchedule's ``TuneContext`` does, once per
    process) in about 4 s instead of 34 (Zen 3).

    Its ~200 TVMScript intrinsics each call ``inspect.stack()``, which looks up the module of
    every frame; for a frame of a file that does not exist (``<frozen importlib._bootstrap>``,
    ``<ast>``: a dozen on an import's stack) ``inspect.getmodule`` scans every loaded module
    (2,000 with TVM and PyTorch) and finds none. During this import those answers are
    remembered per file name, the same ``None`` each time.
    """
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    with getmodule_of_sourceless_frames_cached():
        importlib.import_module("tvm.s_tir.tensor_intrin")  # registers the intrinsics


@contextlib.contextmanager
def getmodule_of_sourceless_frames_cached():
    """While open, ``inspect.getmodule`` remembers its answer for frames of files that do not
    exist (named ``<...>``) per file name (see :func:`import_tensor_intrinsics`)."""
    scan = inspect.getmodule
    known: dict[str, object] = {}

    def getmodule(obj, _filename=None):
        if _filename is None or not _filename.startswith("<") or not inspect.isframe(obj):
            return scan(obj, _filename)
        if _filename not in known:
            known[_filename] = scan(obj, _filename)
        return known[_filename]

    inspect.getmodule = getmodule
    try:
        yield
    finally:
        inspect.getmodule = scan


def build_candidate(mod, target, _params=None):
    """MetaSchedule builder function: MetaSchedule's ``default_build`` without its
    ``import tvm.s_tir.tensor_intrin``, which costs 15-50 s in every fresh builder worker (the
    local builder starts new workers for each batch) and is not needed to compile a schedule,
    and with int32 indices where they fit and the bfloat16 rounding of the target, as
    :func:`topi_bn.build` compiles the kernel."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    # int32 indices, as the build compiles the kernel (64-bit index arithmetic made some
    # kernels 2x slower: candidates measured with it were ranked for code no build runs)
    main = lowering.narrow_indices(mod["main"])
    mod.update_func(mod.get_global_var("main"), native_bf16_rounding(main, target))
    return tvm_build(mod, target=target)


def _builder_runner(target, config: TuneConfig, cores: int, rpc_tracker, rpc_key):
    from tvm.s_tir.meta_schedule.builder import LocalBuilder
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, LocalRunner

    if rpc_tracker is None and rpc_key is None:
        evaluator = None  # MetaSchedule's default
        if config.flush_caches and resolve_target(target).kind.name == "llvm":
            evaluator = EvaluatorConfig(number=1, repeat=config.runner_calls, min_repeat_ms=0,
                                        enable_cpu_cache_flush=True)
        return (LocalBuilder(max_workers=cores, timeout_sec=config.builder_timeout_s,
                             f_build=build_candidate),
                LocalRunner(timeout_sec=config.runner_timeout_s, evaluator_config=evaluator))
    if not rpc_tracker or not rpc_key:
        raise ValueError("rpc_tracker and rpc_key: give both (HOST:PORT and the device key) or "
                         "neither")
    return rpc.make_cross_builder(target), rpc.make_rpc_runner(rpc_tracker, rpc_key)


def _device_type(target) -> str:
    """The runner's device name of ``target`` (``"cpu"`` for llvm)."""
    return "cpu" if target.kind.name == "llvm" else target.kind.name


def default_record(mod, target, builder, runner):
    """The default schedule (what an untuned build runs) measured as one more candidate.

    ``topi-bn tune`` adds this record to every workload it tunes, measured by the same builder
    and runner as the searched candidates, so a build, which takes a workload's fastest record,
    never runs a tuned schedule slower than the default one as measured while tuning. Returns a
    ``TuningRecord`` (its trace replays the default schedule on ``mod``), or None when the
    default schedule fails to build or run.
    """
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.utils import remove_build_dir

    sch = tvm.s_tir.Schedule(mod)
    if not schedule_function(sch, target, tunable=False):
        return None
    (built,) = builder.build([ms.builder.BuilderInput(sch.mod, target)])
    if built.error_msg is not None:
        logger.warning("default schedule failed to build: %s", built.error_msg.splitlines()[-1])
        return None
    args_info = ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])
    try:
        (future,) = runner.run([ms.runner.RunnerInput(built.artifact_path,
                                                      device_type=_device_type(target),
                                                      args_info=args_info)])
        result = future.result()
    finally:
        remove_build_dir(built.artifact_path)
    if result.error_msg is not None or not result.run_secs:
        logger.warning("default schedule failed to run: %s",
                       (result.error_msg or "no time").splitlines()[-1])
        return None
    return ms.database.TuningRecord(sch.trace, ms.database.Workload(mod), result.run_secs,
                                    target, args_info)


def tune(target="x86", workloads="smoke", trials: int = 16, log_dir: str | os.PathLike | None = None,
         space: str = "template", dtype: str = "float32", *, rpc_tracker: str | None = None,
         rpc_key: str | None = None, config: TuneConfig | None = None,
         progress: TextIO | bool | None = True) -> list[TuneResult]:
    """Tune registry workloads with MetaSchedule (XGBoost cost model) into a JSON database.

    Parameters
    ----------
    target : Target, dict or str
        Anything :func:`topi_bn.resolve_target` accepts (``"x86"``: this machine).
    workloads : str or list
        A group (``topi_bn.workloads.groups()``), ``"all"``, comma-separated workload names, or a
        list of names.
    trials : int
        Measured candidates per workload. A workload whose log already has this many trials (for
        this space, dtype and target) is skipped; one with fewer gets the difference. Trials of
        the same kernel under another workload name (a layer two networks share) count.
    log_dir : path, optional
        The MetaSchedule JSON database directory (``database_workload.json`` +
        ``database_tuning_record.json``); created when missing, appended to otherwise.
        Default: ``tuning_logs/<tuning_log_key(target)>`` under the current directory.
    space : ``"template"`` or ``"auto"``
        Our templates with sampled knobs, or MetaSchedule's generic rules on the blocks without
        our annotations.
    dtype : {"float32", "float16", "bfloat16"}
        Element type of the workloads' inputs.
    rpc_tracker, rpc_key : str, optional
        Measure on devices registered at a ``tvm.rpc`` tracker (``HOST:PORT``) under ``KEY``,
        building with the target's cross compiler (:mod:`topi_bn.rpc`).
    config : TuneConfig, optional
        Search and measurement knobs.
    progress : bool, text stream or None
        Where progress lines go: True for stderr (default), a stream, or None/False for silence.

    Returns
    -------
    list of TuneResult
        One per workload, in order.
    """
    from tvm.s_tir import meta_schedule as ms

    progress = progress_stream(progress)
    # a CUDA target from a bare dict or a tag may lack the per-block limits MetaSchedule reads;
    # measured here (no tracker): refuse a target this machine cannot execute
    rt = resolve(target, gpu_limits=True, runnable=rpc_tracker is None)
    tgt = rt.target
    if rpc_tracker is not None:
        parse_tracker(rpc_tracker)
    dtype = check_choice("dtype", dtype, DTYPES)
    chosen = select_workloads(workloads, rt, dtype)
    trials = _check_trials(trials)
    space = check_choice("space", space, SPACES)
    if log_dir is None:
        log_dir = os.path.join("tuning_logs", tuning_log_key(rt))
    log_dir = check_writable_dir("log_dir", log_dir)
    if config is not None and not isinstance(config, TuneConfig):
        raise TypeError(f"config: expected a TuneConfig, got {describe(config)}")
    config = config or TuneConfig()
    cores = config.num_cores or int(tgt.attrs.get("num-cores", 0) or os.cpu_count() or 1)
    per_iter = config.trials_per_iter or min(trials, 16)
    if space == "template":
        try:
            rules_for(tgt)
        except (NotImplementedError, ImportError) as err:
            raise ValueError(f"space: no topi-bn schedule templates for {tgt.kind.name} ({err}); "
                             f"use space='auto'") from None
    builder, runner = _builder_runner(rt, config, cores, rpc_tracker, rpc_key)
    os.makedirs(log_dir, exist_ok=True)

    # what is left to do
    manifest = read_manifest(log_dir)
    # the same kernel under another name (a layer two networks share) is tuned once: the
    # records apply by the PrimFunc, whatever the workload is called
    done_by_kernel: dict[str, tuple[int, str]] = {}
    for k, entry in manifest.items():
        name, _, kernel = k.partition("|")
        n = int(entry.get("trials", 0)) if isinstance(entry, dict) else 0
        if n > done_by_kernel.get(kernel, (0, ""))[0]:
            done_by_kernel[kernel] = (n, name)
    plan, planned = [], {}
    for w in chosen:
        func = workload_prim_func(w, dtype, rt)
        mod = build_visible_mod(func)
        key = _manifest_key(w, dtype, space, rt, mod)
        kernel = key.partition("|")[2]
        done, same_as = done_by_kernel.get(kernel, (0, ""))
        if kernel in planned:  # tuned in this run under the earlier name
            done, same_as = trials, planned[kernel]
        planned.setdefault(kernel, w.name)
        same_as = "" if same_as == w.name else same_as
        plan.append((w, func, mod, key, max(0, trials - done), done, same_as))
    prog = _Progress(sum(p[4] for p in plan), progress)

    results = []
    for i, (w, func, mod, key, budget, done, same_as) in enumerate(plan):
        label = f"{i + 1}/{len(plan)} {w.name}"
        if budget == 0:
            results.append(TuneResult(w.name, "skipped"))
            if progress is not None:
                what = f" (the same kernel as {same_as})" if same_as else ""
                progress.write(f"[skip] {label}: {done} trials already in {log_dir}{what}\n")
            continue
        if space == "template":
            task_func, task_space = func, template_space(tgt)
        else:
            task_func, task_space = strip_rules(func), "post-order-apply"
        state = {"trials": 0, "best": None}
        import_tensor_intrinsics()  # what TuneContext imports, without its 30 s of inspect
        with tempfile.TemporaryDirectory(prefix="topi_bn_tune_") as work:
            with _QuietMetaSchedule(os.path.join(work, "metaschedule.log")):
                ctx = ms.TuneContext(
                    mod=task_func, target=tgt, space_generator=task_space,
                    search_strategy=ms.search_strategy.EvolutionarySearch(
                        population_size=config.population_for(budget)),
                    task_name=w.name,
                    rand_state=-1 if config.seed is None else config.seed + i,
                    num_threads=cores,
                    logger=logging.getLogger("tvm.s_tir.meta_schedule.topi_bn"),
                ).clone()
                callbacks = ms.MeasureCallback.create("default") + [
                    _make_callback(prog, w, label, budget, dtype, state)]
                db = ms.tune_tasks(
                    tasks=[ctx], task_weights=[1.0], work_dir=work,
                    max_trials_global=budget, max_trials_per_task=budget,
                    num_trials_per_iter=per_iter, builder=builder, runner=runner,
                    database=ms.database.MemoryDatabase(), cost_model="xgb",
                    measure_callbacks=callbacks, task_scheduler="round-robin")
            records = db.get_all_tuning_records()
            measured = max(state["trials"], len(records))
            default = default_record(mod, tgt, builder, runner)
        if default is not None:
            records = list(records) + [default]
        entry = {"workload": w.name, "dtype": dtype, "space": space, "target": str(tgt),
                 "trials": done + measured}
        if measured < budget:
            # MetaSchedule stopped early: the space has no unmeasured candidate left
            entry["trials"] = trials
            entry["exhausted"] = True
        total = merge_records(log_dir, mod, records, key, entry)
        best_us = None if state["best"] is None else state["best"] * 1e6
        metric = "" if state["best"] is None else prog.metric(w, state["best"], dtype)
        extra = {}
        if default is not None:
            extra["default_us"] = 1e6 * sum(float(x) for x in default.run_secs) / len(default.run_secs)
        results.append(TuneResult(w.name, "tuned", measured, best_us, total, metric, extra))
        logger.info("tuned %s: %d trials, best %s", w.name, measured, metric or "none")
    return results
