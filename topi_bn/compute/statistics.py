"""Mean and variance of a reduction, blocked and two-pass at every level (TE, no schedule).

Shared by :func:`~topi_bn.compute.batch_norm_train` (one reduction per channel) and
:func:`~topi_bn.compute.layer_norm` (one per row). The :math:`n` values of one reduction, in
memory order, are viewed as an array of shape :math:`(b, G, K)` (:class:`Blocking`, chosen from
the static shape) and reduced one axis at a time, slowest first:

- a *chunk* (``j, g`` fixed) holds :math:`b` values :math:`x_i`,
- a *group* (``g`` fixed) holds :math:`G` chunks,
- the *total* holds :math:`K` groups.

Each level is two passes over its children (values, chunks or groups), each child :math:`k`
carrying a count :math:`m`, a mean :math:`h_k + l_k` held as two floats and a sum of squared
deviations :math:`M_k` (:math:`m = 1, l = M = 0` for a value):

.. math::

    H = \\frac{1}{K_L}\\sum_k h_k, \\qquad
    e_k = (h_k - H) + l_k, \\qquad
    L = \\frac{1}{K_L}\\sum_k e_k, \\qquad
    M = \\sum_k \\big(M_k + m\\,e_k^2\\big) - m K_L L^2

(mean first, then deviations from that mean: Chan, Golub & LeVeque, 1983, with their
correction term :math:`m K_L L^2`, which removes the rounding error of :math:`H`). The result is
the mean :math:`\\mu = H + L` of the top level, still two floats, and the biased variance
:math:`\\sigma^2 = M / n`. No sum runs over more than :math:`\\max(b, G, K)` terms, and no pivot
element is involved: an outlier only weighs on its own chunk. Consumers subtract :math:`H` and
:math:`L` separately (:meth:`Stats.centered`), so data far from zero (mean 1e4 or 1e6, std 1) keeps
the digits of its deviations.

Accumulation is in ``acc`` (float32 for float16/bfloat16/float32 data, float64 for float64).
Means are sums of :math:`h_k / K_L` and deviations are halved before they are squared, so no
intermediate overflows unless the variance itself does: for float32 data whose variance exceeds
the float32 range (std above about 1.8e19, or values near +-3e38 of both signs) the variance is
``inf``, the mean stays finite, and normalizing with ``inf`` gives a scale of 0, so ``y = beta``:
what ``torch.nn.functional.batch_norm`` returns on the CPU.

Blocks (``p`` is ``bn`` or ``ln``): ``p_chunk_mean``, ``p_chunk_dev`` (two outputs: the sums of
:math:`e/2` and of :math:`M/4 + m (e/2)^2`), ``p_group_mean``, ``p_group_dev``, ``p_mean``,
``p_dev``. The ``_dev`` blocks reduce with :data:`SUM2`, a two-output sum that is registered with
TVM's reducer registry on import, so that ``rfactor`` and cross-thread reductions accept it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import tvm
from tvm import te

__all__ = ["Blocking", "blocking", "Stats", "two_pass_stats", "MAX_CHUNK"]

#: Longest chunk: what one GPU thread keeps in registers for both passes.
MAX_CHUNK = 32


# -- how a reduction is split -------------------------------------------------------------------
@dataclass(frozen=True)
class Blocking:
    """The :math:`(b, G, K)` view of a reduction of :math:`n = b G K` values (memory order).

    Attributes
    ----------
    chunk : int
        :math:`b`, values per chunk (the slowest axis); at most :data:`MAX_CHUNK`.
    group : int or PrimExpr
        :math:`G`, chunks per group (symbolic when the reduction has a symbolic axis).
    lanes : int
        :math:`K`, groups; consecutive groups are consecutive in memory (the fastest axis).
    """

    chunk: int
    group: Any
    lanes: int

    @property
    def count(self):
        return self.chunk * self.group * self.lanes


def _aligned_sizes(shape: Sequence[int]) -> list[int]:
    """Sizes ``d * prod(shape[k+1:])`` with ``d`` dividing ``shape[k]``: the trailing blocks of
    the row-major flattening whose index splits into whole axes plus one axis part."""
    out, suffix = {1}, 1
    for ext in reversed(shape):
        out.update(d * suffix for d in range(1, ext + 1) if ext % d == 0)
        suffix *= ext
    return sorted(out)


def _nearest(cands: Sequence[int], target: float, prefer: int = 32) -> int:
    """The candidate nearest ``target`` in ratio; multiples of ``prefer`` within a factor 2 win
    (a warp of GPU threads, whole vectors on every CPU)."""
    good = [c for c in cands if c % prefer == 0 and target / 2 <= c <= target * 2]
    pool = good or list(cands)
    return min(pool, key=lambda c: (abs(math.log(c / target)), -c))


def blocking(red_shape: Sequence[Any]) -> Blocking:
    """The :class:`Blocking` of a reduction over ``red_shape`` (row-major, in memory order).

    :math:`K` is the size nearest :math:`\\sqrt{n}` that splits the shape at an axis boundary
    (or inside one axis), preferring multiples of 32; :math:`b` is as large as
    :data:`MAX_CHUNK` allows with :math:`G K` split the same way, and :math:`G` what is left.
    Only the static trailing axes are split: with a symbolic axis :math:`b = 1` and :math:`G`
    is symbolic. A prime :math:`n` has no split: :math:`b = G = 1`, :math:`K = n`.
    """
    static = []
    for ext in reversed(red_shape):
        if not isinstance(ext, int):
            break
        static.insert(0, ext)
    sizes = _aligned_sizes(static)
    suffix = math.prod(static)
    if len(static) < len(red_shape):  # a symbolic axis: blocks of the static part only
        lanes = _nearest(sizes, math.sqrt(suffix))
        count = 1
        for ext in red_shape:
            count = count * ext
        return Blocking(1, tvm.tirx.floordiv(count, lanes), lanes)
    n = suffix
    lanes = _nearest(sizes, math.sqrt(n))
    # smallest aligned G*K (a multiple of K) whose chunks are at most MAX_CHUNK long
    gk = min(s for s in sizes if s % lanes == 0 and n // s <= MAX_CHUNK)
    return Blocking(n // gk, gk // lanes, lanes)


def _unflatten(u, g, lanes: int, shape: Sequence[Any]) -> list:
    """Row-major index in ``shape`` of flat position ``u * lanes + g`` (``0 <= g < lanes``),
    with ``lanes`` a size of :func:`_aligned_sizes`: the axes inside ``lanes`` are indexed from
    ``g`` alone, the ones outside from ``u`` alone, and the one axis ``lanes`` cuts through from
    both. Written this way, the flattened address is affine in ``g`` for the simplifier, so
    schedules can vectorize along ``g`` across rows of the innermost axis."""
    fd, fm = tvm.tirx.floordiv, tvm.tirx.floormod
    nd = len(shape)
    suffix = [1] * (nd + 1)  # suffix[k] = product of shape[k:] (static part)
    for k in range(nd - 1, -1, -1):
        suffix[k] = suffix[k + 1] * shape[k] if isinstance(shape[k], int) else None
    if lanes == 1 and not isinstance(shape[-1], int):
        # a symbolic innermost axis (e.g. a symbolic batch reduced alone): plain row-major
        idx, rem = [], u
        for ext in reversed(shape[1:]):
            idx.insert(0, fm(rem, ext))
            rem = fd(rem, ext)
        return [rem] + idx
    k = next(k for k in range(nd - 1, -1, -1) if suffix[k + 1] is not None
             and lanes % suffix[k + 1] == 0 and isinstance(shape[k], int)
             and shape[k] % (lanes // suffix[k + 1]) == 0)
    d = lanes // suffix[k + 1]
    idx = [fm(fd(g, suffix[m + 1]), shape[m]) for m in range(k + 1, nd)]
    cut = shape[k] // d
    idx.insert(0, fm(u, cut) * d + fd(g, suffix[k + 1]))
    rest = fd(u, cut)
    for m in range(k - 1, -1, -1):
        idx.insert(0, fm(rest, shape[m]) if m else rest)
        rest = fd(rest, shape[m])
    return idx


# -- the statistics -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Stats:
    """Mean and biased variance of each reduction (indexed like ``outer_shape``).

    ``mean_hi`` is the :math:`H` of the top level (a tensor); the other members are functions of
    the outer index returning ``acc`` expressions.
    """

    mean_hi: te.Tensor
    half_lo: Callable[..., Any]  # L / 2
    var: Callable[..., Any]      # M / n, inf when it overflows
    acc: str

    def mean(self, *o):
        """:math:`H + L` rounded to one float (the statistics outputs)."""
        return self.mean_hi[o] + self.half_lo(*o) * tvm.tirx.const(2, self.acc)

    def centered(self, x, *o):
        """:math:`(x - \\mu) / 2`, exact where :math:`x - H` is: halves of ``x`` and :math:`H`
        (exact) are subtracted first, then :math:`L / 2`. Never overflows."""
        half = tvm.tirx.const(0.5, self.acc)
        return (x * half - self.mean_hi[o] * half) - self.half_lo(*o)


def two_pass_stats(prefix: str, outer_shape: Sequence[Any], red_shape: Sequence[Any],
                   element: Callable[[tuple, list], Any], acc: str, attrs: dict,
                   outer_last: bool = False) -> Stats:
    """Blocked two-pass statistics (module docstring) of ``element(outer_index, red_index)``
    (an ``acc`` expression) over ``red_shape``, for every index of ``outer_shape``.

    The chunk and group buffers are indexed ``outer + (j, g)`` and ``outer + (g,)``, or
    ``(j, g) + outer`` and ``(g,) + outer`` with ``outer_last`` (channels-last data, whose
    channels are the contiguous axis)."""
    blk = blocking(red_shape)
    b, G, K = blk.chunk, blk.group, blk.lanes
    outer = tuple(outer_shape)
    nd = len(outer)
    c = lambda v: tvm.tirx.const(v, acc)  # noqa: E731
    half = c(0.5)
    big = tvm.tirx.max_value(acc)

    def split(i):  # a level's index -> (outer index, the level's own axes)
        return (tuple(i[len(i) - nd:]), tuple(i[:len(i) - nd])) if outer_last else \
            (tuple(i[:nd]), tuple(i[nd:]))

    def join(o, rest):
        return tuple(rest) + tuple(o) if outer_last else tuple(o) + tuple(rest)

    def level(tag, rest_shape, children, child_count, n_children):
        """Two passes over the ``n_children`` children ``children(o, rest, r) -> (h, l/2, M/4)``
        of each element of a ``rest_shape`` level; returns ``(mean tensor, accessor of this
        level's (h, l/2, M/4))``."""
        shape = join(outer, rest_shape)
        inv = c(1) / _as_acc(n_children, acc)
        name = f"{tag or 'total'}_"
        r = te.reduce_axis((0, n_children), name=name + "r")
        mean = te.compute(shape, lambda *i: te.sum(children(*split(i), r)[0] * inv, axis=r),
                          name=f"{prefix}_{tag}mean", attrs=attrs)

        def half_dev(i, r_):  # (h - H) / 2 + l / 2 and M / 4 of child r_
            h, lh, q = children(*split(i), r_)
            return (h * half - mean[i] * half) + lh, q

        r2 = te.reduce_axis((0, n_children), name=name + "s")
        lo = te.compute(shape, lambda *i: te.sum(half_dev(i, r2)[0] * inv, axis=r2),
                        name=f"{prefix}_{tag}lo", attrs=attrs)
        r3 = te.reduce_axis((0, n_children), name=name + "q")

        def sq_fn(*i):
            w, q = half_dev(i, r3)
            return te.sum(q + child_count * w * w, axis=r3)

        sq = te.compute(shape, sq_fn, name=f"{prefix}_{tag}sq", attrs=attrs)
        size = child_count * _as_acc(n_children, acc)

        def result(o, rest):
            i = join(o, rest)
            # M/4 = Q - N (L/2)^2; N (L/2)^2 <= Q, so capping it at the largest float changes
            # nothing unless Q overflowed, and then keeps inf - inf from making a NaN
            return mean[i], lo[i], sq[i] - te.min(size * lo[i] * lo[i], big)

        return mean, result

    def value(o, rest, i):
        jj, g = rest
        return element(o, _unflatten(jj * b + i, g, K, list(red_shape))), c(0), c(0)

    _, chunk = level("chunk_", (G, K), value, c(1), b)
    _, group = level("group_", (K,), lambda o, rest, jj: chunk(o, (jj,) + rest), c(b), G)
    mean_hi, total = level("", (), lambda o, rest, g: group(o, (g,)), c(b) * _as_acc(G, acc), K)
    n = c(b) * _as_acc(G, acc) * c(K)

    def var(*o):  # M / n, clamped at 0 against rounding (a NaN stays a NaN)
        q = total(o, ())[2]
        return tvm.tirx.Select(q < c(0), c(0), q) * c(4) / n

    return Stats(mean_hi=mean_hi, half_lo=lambda *o: total(o, ())[1], var=var, acc=acc)


def _as_acc(v, acc):
    return tvm.tirx.const(v, acc) if isinstance(v, int) else tvm.tirx.Cast(acc, v)
