"""Runner executed by the aarch64 Python under qemu-aarch64 (see topi_bn.arm_emulation).

Standalone on purpose: it imports only numpy and the TVM runtime, never topi_bn (whose
package import needs the TVM compiler, which the sysroot does not ship).
Usage: python _qemu_runner.py SPEC.json, SPEC = {so, func, inputs: [npy], outputs: [{path, shape, dtype}]}
"""
import json
import sys

import numpy as np
import tvm


def main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    dev = tvm.cpu(0)
    lib = tvm.runtime.load_module(spec["so"])
    args = [tvm.runtime.tensor(np.load(p), dev) for p in spec["inputs"]]
    outs = [tvm.runtime.tensor(np.zeros(o["shape"], o["dtype"]), dev) for o in spec["outputs"]]
    lib[spec["func"]](*args, *outs)
    for o, t in zip(spec["outputs"], outs):
        np.save(o["path"], t.numpy())


if __name__ == "__main__":
    main(sys.argv[1])
