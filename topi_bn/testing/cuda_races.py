"""A static check for intra-block data races in CUDA kernels, run on every machine (no GPU).

TVM's GPU verification and an nvcc compile cannot see races, and the first training batch-norm and
layer_norm kernels raced on an H100 while passing both (issue 14). This check walks each kernel of
the lowered device TIR (what the CUDA code generator receives: threads launched, cross-thread
reductions lowered to shuffles and shared memory, barriers inserted) and reports

- **uniform store**: a store to shared or global memory whose location does not depend on a thread
  index along which the store runs on several threads (e.g. ``red_result[0] = red_result[0] / n``
  executed by every thread, or ``bn_mean[c]`` written by every ``threadIdx.y``). A thread index is
  *pinned* inside an ``if`` whose condition fixes it to one value (``threadIdx.x == 0``); a store
  with every unpinned index in its location is race-free.
- **read before barrier**: a read of a shared or global location that one thread wrote for others
  (a location that does not depend on every thread index, written under such a guard) before a
  barrier separates them, outside the guard: thread 0 writes ``bn_mean[c]`` and all threads read
  it at once, or lane ``threadIdx.x == 0`` of each row writes ``ln_mean[threadIdx.z]`` and the
  other lanes of the row read it. The barrier is ``__syncthreads()``, or ``__syncwarp()`` where the
  writer and its readers lie in one warp. Lanes of one warp are not ordered without a barrier
  since Volta (independent thread scheduling); TVM's ``tvm_storage_sync("warp")`` emits no CUDA
  at all and is not one.

It does not reason about races between thread blocks, or about two different thread-dependent
locations that happen to coincide.

Use :func:`find_races` on a scheduled module (the check lowers it for the target), or
:func:`kernel_races` on one already-lowered device kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import tvm
from tvm import tirx

from topi_bn.targets import resolve_target

__all__ = ["Race", "find_races", "kernel_races", "lowered_kernels"]

_SCOPES = ("shared", "shared.dyn", "global")
_WARP = 32  # threads per warp on every CUDA GPU


@dataclass(frozen=True)
class Race:
    """One finding: ``kind`` is ``"uniform store"`` or ``"read before barrier"``."""

    kernel: str
    buffer: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kernel}: {self.kind} on {self.buffer}: {self.detail}"


def lowered_kernels(mod: tvm.IRModule, target) -> list[tuple[str, tirx.PrimFunc]]:
    """``(name, kernel)`` for every device kernel of ``mod`` (scheduled PrimFuncs) lowered for the
    CUDA ``target`` with TVM's default TIR pipeline, as ``tvm.compile`` lowers them."""
    from tvm.tirx.build import split_host_device_mods

    target = resolve_target(target)
    if isinstance(mod, tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    mod = tirx.transform.BindTarget(target.with_host(target.host or "llvm"))(mod)
    pipeline, _, _ = tirx.get_default_tir_pipeline(target)
    with target:
        mod = pipeline(mod)
    _, device = split_host_device_mods(mod)
    out = []
    for dev_mod in device.values():
        for gv, func in dev_mod.functions_items():
            if isinstance(func, tirx.PrimFunc):
                out.append((gv.name_hint, func))
    return sorted(out, key=lambda kv: kv[0])


def find_races(mod: tvm.IRModule, target) -> list[Race]:
    """Races in every CUDA kernel of the scheduled ``mod`` (see the module docstring)."""
    races = []
    for name, func in lowered_kernels(mod, target):
        races.extend(kernel_races(func, name))
    return races


def kernel_races(func: tirx.PrimFunc, name: str = "kernel") -> list[Race]:
    """Races in one lowered device kernel (a PrimFunc with ``thread_extent`` attributes)."""
    walker = _Walker(name)
    walker.stmt(func.body)
    return list(dict.fromkeys(walker.races))  # de-duplicated, in order


# ----------------------------------------------------------------------------------------------
@dataclass
class _Pending:
    """A store that other threads may read (its location misses a thread index), not yet followed
    by a barrier; ``one_warp``: the writer and those readers lie in one warp."""

    pinned: frozenset
    text: str
    one_warp: bool


@dataclass
class _Walker:
    kernel: str
    threads: dict = field(default_factory=dict)     # thread var -> extent
    tags: dict = field(default_factory=dict)        # thread var -> "threadIdx.x" / "y" / "z"
    lets: dict = field(default_factory=dict)        # var -> bound value
    conditions: list = field(default_factory=list)  # enclosing if-conditions (with polarity)
    owners: dict = field(default_factory=dict)      # buffer view -> buffer whose memory it is
    pending: dict = field(default_factory=dict)     # owner buffer -> _Pending
    races: list = field(default_factory=list)

    # -- thread analysis -------------------------------------------------------------------
    def _deps(self, expr) -> set:
        """Variables ``expr`` depends on, through let bindings."""
        seen, todo = set(), list(tirx.analysis.undefined_vars(expr))
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in self.lets:
                todo.extend(tirx.analysis.undefined_vars(self.lets[v]))
        return seen

    def _pinned(self) -> frozenset:
        """Thread vars (extent > 1) that the enclosing conditions fix to one value: by the
        bounds the conditions imply (``threadIdx.x < 1``), or by an equation whose thread
        terms cannot cancel (``threadIdx.x + threadIdx.y * 32 == 0``)."""
        if not self.conditions:
            return frozenset()
        ana = tvm.sym.Analyzer()
        for v, ext in self.threads.items():
            ana.bind(v, tvm.ir.Range(0, ext))
        for v, value in self.lets.items():
            try:
                ana.bind(v, value)
            except Exception:  # noqa: BLE001 - a non-integer let; irrelevant for thread indices
                pass
        pinned = set()
        threads = [v for v, ext in self.threads.items() if ext > 1]
        for cond in self.conditions:
            for eq in _conjuncts(cond):
                pinned |= self._pinned_by(ana, eq, threads)
        scopes = [ana.constraint_scope(cond) for cond in self.conditions]
        for scope in scopes:
            scope.__enter__()
        try:
            for v in threads:
                bound = ana.const_int_bound(v)
                if bound.min_value == bound.max_value:
                    pinned.add(v)
        finally:
            for scope in reversed(scopes):
                scope.__exit__(None, None, None)
        return frozenset(pinned)

    def _pinned_by(self, ana, cond, threads) -> set:
        """Thread vars an equation ``sum(a_i * t_i) + c == 0`` fixes: all of them when it has
        one thread term, or when every coefficient has the sign that makes ``c`` the only
        reachable value (the threads start at 0)."""
        if not isinstance(cond, tvm.ir.prim.expr.EQ):
            return set()
        expr = ana.simplify(cond.a - cond.b)  # let-bound vars are bound in ana
        coeffs = tvm.sym.detect_linear_equation(expr, threads)
        if len(coeffs) != len(threads) + 1:
            return set()
        terms = [(v, c) for v, c in zip(threads, coeffs[:-1])
                 if not (isinstance(c, tvm.ir.prim.expr.IntImm) and int(c) == 0)]
        if not terms or not all(isinstance(c, tvm.ir.prim.expr.IntImm) for _, c in terms):
            return set()
        const = coeffs[-1]
        if len(terms) == 1:
            return {terms[0][0]}
        signs = {int(c) > 0 for _, c in terms}
        if isinstance(const, tvm.ir.prim.expr.IntImm) and int(const) == 0 and len(signs) == 1:
            return {v for v, _ in terms}
        return set()

    def _free_threads(self, pinned) -> set:
        return {v for v, ext in self.threads.items() if ext > 1 and v not in pinned}

    def _owner(self, buf):
        """The buffer whose memory ``buf`` is (the storage planner declares views of a buffer it
        reuses: ``ln_group_mean_shared_2 = ln_group_mean_shared.view(16)``)."""
        return self.owners.get(buf, buf)

    def _one_warp(self, shared_by) -> bool:
        """Whether threads that differ only in the thread vars ``shared_by`` lie in one warp: the
        thread dimensions up to the outermost of them (``threadIdx.x`` innermost in the linear
        thread id) span a divisor of the warp size."""
        span, left = 1, set(shared_by)
        for v in sorted(self.threads, key=lambda v: self.tags[v]):  # threadIdx.x, .y, .z
            if not left:
                break
            span *= self.threads[v]
            left.discard(v)
        return _WARP % span == 0

    # -- expressions -----------------------------------------------------------------------
    def expr(self, e) -> None:
        if e is None or not isinstance(e, tvm.ir.expr.Expr):
            return
        if isinstance(e, tvm.ir.expr.TensorLoad):  # a BufferLoad
            self._load(e)
            for i in e.indices:
                self.expr(i)
            return
        if isinstance(e, tirx.Let):
            self.expr(e.value)
            self.lets[e.var] = e.value
            self.expr(e.body)
            return
        for attr in ("a", "b", "value", "condition", "true_value", "false_value", "base",
                     "stride"):
            if hasattr(e, attr):
                self.expr(getattr(e, attr))
        if hasattr(e, "args"):
            for arg in e.args:
                self.expr(arg)

    def _load(self, load) -> None:
        buf = load.source
        if buf.scope() not in _SCOPES or self._owner(buf) not in self.pending:
            return
        pend = self.pending[self._owner(buf)]
        if pend.pinned <= self._pinned() and pend.pinned:
            return  # read by the thread(s) that wrote it
        barrier = "__syncwarp() or __syncthreads()" if pend.one_warp else "__syncthreads()"
        self.races.append(Race(self.kernel, self._owner(buf).name, "read before barrier",
                               f"{_text(load)} reads what {pend.text!r} wrote, with no "
                               f"{barrier} in between"))

    # -- statements ------------------------------------------------------------------------
    def stmt(self, s) -> None:
        if s is None:
            return
        if isinstance(s, tirx.SeqStmt):
            for child in s.seq:
                self.stmt(child)
        elif isinstance(s, tirx.AttrStmt):
            self.expr(s.value)
            if s.attr_key == "thread_extent" and str(s.node.thread_tag).startswith("threadIdx"):
                self.threads[s.node.var] = int(s.value)
                self.tags[s.node.var] = str(s.node.thread_tag)
            self.stmt(s.body)
        elif isinstance(s, tirx.For):
            self.expr(s.min)
            self.expr(s.extent)
            # twice: a read early in the body may follow a write of the previous iteration
            self.stmt(s.body)
            self.stmt(s.body)
        elif isinstance(s, tirx.While):
            self.expr(s.condition)
            self.stmt(s.body)
            self.stmt(s.body)
        elif isinstance(s, tirx.IfThenElse):
            self.expr(s.condition)
            self.conditions.append(s.condition)
            self.stmt(s.then_case)
            self.conditions.pop()
            if s.else_case is not None:
                self.conditions.append(tirx.Not(s.condition))
                self.stmt(s.else_case)
                self.conditions.pop()
        elif isinstance(s, tirx.Bind):
            self.expr(s.value)
            self.lets[s.var] = s.value
        elif isinstance(s, tirx.DeclBuffer):
            data = s.data  # ``buffer_data(owner)`` for a view of another buffer
            if isinstance(data, tvm.ir.Call) and isinstance(data.op, tvm.ir.Op) and \
                    data.op.name == "tirx.buffer_data":
                self.owners[s.buffer] = self._owner(data.args[0])
        elif isinstance(s, tirx.BufferStore):
            self.expr(s.value)
            for i in s.indices:
                self.expr(i)
            self._store(s)
        elif isinstance(s, tirx.Evaluate):
            barrier = _barrier(s.value)
            if barrier == "block":
                self.pending.clear()
            elif barrier == "warp":
                self.pending = {k: p for k, p in self.pending.items() if not p.one_warp}
            else:
                self.expr(s.value)
        else:
            for attr in ("value", "condition", "message"):
                if hasattr(s, attr):
                    self.expr(getattr(s, attr))
            if hasattr(s, "body"):
                self.stmt(s.body)

    def _store(self, store) -> None:
        buf = store.buffer
        if buf.scope() not in _SCOPES:
            return
        pinned = self._pinned()
        deps = set()
        for i in store.indices:
            deps |= self._deps(i)
        text = _text(store)
        missing = self._free_threads(pinned) - deps
        if missing:
            names = ", ".join(sorted(str(v.name) for v in missing))
            self.races.append(Race(self.kernel, self._owner(buf).name, "uniform store",
                                   f"{text!r} runs on every {names} (extent > 1) and writes "
                                   f"the same location"))
        shared_by = {v for v, ext in self.threads.items() if ext > 1} - deps
        if shared_by:  # threads that differ only in these read the same location
            self.pending[self._owner(buf)] = _Pending(pinned, text, self._one_warp(shared_by))


def _conjuncts(cond) -> list:
    if isinstance(cond, tvm.ir.prim.expr.And):
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


def _barrier(e) -> str | None:
    """``"block"`` for a call that becomes ``__syncthreads()``, ``"warp"`` for ``__syncwarp()``."""
    if not isinstance(e, tvm.ir.Call) or not isinstance(e.op, tvm.ir.Op):
        return None
    name = e.op.name
    if name == "tirx.tvm_storage_sync":
        return "block" if str(e.args[0].value) in ("shared", "shared.dyn", "global") else None
    return {"tirx.cuda.cta_sync": "block", "tirx.cuda.warp_sync": "warp"}.get(name)


def _text(node) -> str:
    """``buf[i, j]`` for a load, ``buf[i, j] = value`` for a store (one line, shortened)."""
    if isinstance(node, tirx.BufferStore):
        buf, value = node.buffer, f" = {node.value}"
    else:
        buf, value = node.source, ""
    text = f"{buf.name}[{', '.join(str(i) for i in node.indices)}]{value}"
    text = " ".join(text.split())
    return text if len(text) <= 160 else text[:157] + "..."
