"""High-bias absorption decided from a batch-norm fold record.

Nagel et al., "Data-Free Quantization Through Weight Equalization and Bias Correction"
(ICCV 2019), section 4.1; AIMET's ``HighBiasFold``.

After BN folding, output channel ``c`` of a folded layer is, over the data, roughly
normal with the BN's statistics:

.. math::

    y_c \\sim \\mathcal{N}(\\beta_c, |\\gamma_c|)

If a ReLU follows and the channel is positive with high probability, the ReLU is the identity
on it, and a constant

.. math::

    h_c = \\max(0, \\beta_c - k |\\gamma_c|), \\qquad k = 3

can be moved out of this layer's bias (``b_c - h_c``) into the next layer's bias
(``b' + W' h``, summed over the next layer's input channels and kernel window) without
changing the network output for all but ~0.1 % of inputs. This shrinks the range of the
activations, which helps their quantization. The rule used here: a channel moves iff
``beta_c - 3 |gamma_c| > 0``, with ``gamma`` and ``beta`` as the fold record reports them
(the values the BN applied).

Run ``python -m topi_bn.examples.high_bias_absorption``: it builds a small conv-BN-ReLU
network, folds it with :func:`topi_bn.fold_batch_norm`, checks the folded network against
the original and prints the per-channel table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from topi_bn import FoldRecord, fold_batch_norm


@dataclass
class LayerAbsorption:
    """Per-channel output statistics of one folded layer and what absorption would move.

    ``mean``, ``std`` and ``absorb`` are 1-D with shape (C,): ``mean = beta``,
    ``std = |gamma|``, ``absorb = max(0, beta - n_std * std)``.
    """

    layer: str
    bn: str
    mean: np.ndarray
    std: np.ndarray
    absorb: np.ndarray

    @property
    def moved_channels(self) -> list[int]:
        """Indices of the channels whose bias part ``absorb`` would move to the next layer."""
        return [int(c) for c in np.flatnonzero(self.absorb > 0)]


def high_bias_absorption(record: FoldRecord, n_std: float = 3.0) -> list[LayerAbsorption]:
    """Output statistics and absorbable bias of every layer in ``record``.

    Parameters
    ----------
    record : FoldRecord
        From :func:`topi_bn.fold_batch_norm`.
    n_std : float
        How many standard deviations above zero a channel's mean must lie to be moved.

    Returns
    -------
    list of LayerAbsorption
        One per folded layer, in record order:
        ``absorb_c = max(0, beta_c - n_std * |gamma_c|)``.

    Notes
    -----
    The rule assumes a ReLU follows the layer; the record does not say what follows, so the
    caller applies the result only to such layers (all of them in :class:`SmallNet`).
    """
    result = []
    for entry in record.folded:
        mean = np.asarray(entry.beta, np.float64)
        std = np.abs(np.asarray(entry.gamma, np.float64))
        result.append(LayerAbsorption(entry.layer, entry.bn, mean, std,
                                      np.maximum(0.0, mean - n_std * std)))
    return result


def format_table(layers: list[LayerAbsorption]) -> str:
    """A text table: one row per channel of each folded layer."""
    rows = [f"{'layer':<8}{'bn':<6}{'ch':>4}{'mean':>9}{'std':>8}{'absorb':>9}  moves"]
    for layer in layers:
        for c, (m, s, h) in enumerate(zip(layer.mean, layer.std, layer.absorb)):
            rows.append(f"{layer.layer:<8}{layer.bn:<6}{c:>4}{m:>9.3f}{s:>8.3f}{h:>9.3f}  "
                        f"{'yes' if h > 0 else ''}")
    return "\n".join(rows)


@I.ir_module
class SmallNet:
    """conv-BN-ReLU, conv-BN-ReLU, global average pool, linear."""

    @R.function
    def main(x: R.Tensor((1, 3, 16, 16), "float32"),
             w1: R.Tensor((8, 3, 3, 3), "float32"), g1: R.Tensor((8,), "float32"),
             b1: R.Tensor((8,), "float32"), m1: R.Tensor((8,), "float32"),
             v1: R.Tensor((8,), "float32"),
             w2: R.Tensor((8, 8, 3, 3), "float32"), g2: R.Tensor((8,), "float32"),
             b2: R.Tensor((8,), "float32"), m2: R.Tensor((8,), "float32"),
             v2: R.Tensor((8,), "float32"),
             fc_w: R.Tensor((10, 8), "float32"), fc_b: R.Tensor((10,), "float32")):
        with R.dataflow():
            conv1 = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])
            bn1 = R.nn.batch_norm(conv1, g1, b1, m1, v1, axis=1, training=False)
            relu1 = R.nn.relu(bn1[0])
            conv2 = R.nn.conv2d(relu1, w2, padding=[1, 1, 1, 1])
            bn2 = R.nn.batch_norm(conv2, g2, b2, m2, v2, axis=1, training=False)
            relu2 = R.nn.relu(bn2[0])
            pool = R.mean(relu2, axis=[2, 3])
            logits = R.add(R.matmul(pool, R.permute_dims(fc_w)), fc_b)
            R.output(logits)
        return logits


def small_net_params(seed: int = 0) -> dict[str, np.ndarray]:
    """Random parameters for :class:`SmallNet`; BN offsets spread wide enough that some
    channels have ``beta > 3 |gamma|``."""
    rng = np.random.default_rng(seed)
    params = {}
    for p in SmallNet["main"].params[1:]:
        shape = [int(d) for d in p.ty.shape]
        if p.name[0] == "g":
            value = rng.uniform(0.2, 1.0, shape) * rng.choice([-1, 1], shape)
        elif p.name[0] == "b":
            value = rng.normal(0.5, 2.0, shape)
        elif p.name[0] == "v":
            value = rng.uniform(0.5, 2.0, shape)
        else:
            value = rng.standard_normal(shape) * (0.3 if p.name[0] == "w" else 1.0)
        params[p.name] = value.astype("float32")
    return params


def _run(mod, args):
    exe = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(exe, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def main() -> list[LayerAbsorption]:
    params = small_net_params()
    new_mod, new_params, record = fold_batch_norm(SmallNet, params)
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32")
    ref = _run(SmallNet, [x, *params.values()])
    out = _run(new_mod, [x, *new_params.values()])
    err = np.max(np.abs(out - ref)) / np.max(np.abs(ref))
    print(f"folded {len(record.folded)} layers ({', '.join(f.layer for f in record.folded)}), "
          f"skipped {len(record.skipped)}; max relative difference {err:.1e}")
    layers = high_bias_absorption(record)
    print("rule: channel moves iff beta - 3 |gamma| > 0; absorb = max(0, beta - 3 |gamma|)")
    print(format_table(layers))
    return layers


if __name__ == "__main__":
    main()
