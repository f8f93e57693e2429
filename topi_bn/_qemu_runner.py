"""Runner executed by the aarch64 Python under qemu-aarch64 (see topi_bn.arm_emulation).

Standalone on purpose: it imports only numpy and the TVM runtime, never topi_bn (whose
package import needs the TVM compiler, which the sysroot does not ship).
Usage: python _qemu_runner.py SPEC.json with
SPEC = {so, calls: [{func, inputs: [npy path], outputs: [{path, shape, dtype}]}]}
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
    for call in spec["calls"]:
        args = [tvm.runtime.tensor(np.load(p), dev) for p in call["inputs"]]
        outs = [tvm.runtime.tensor(np.zeros(o["shape"], o["dtype"]), dev) for o in call["outputs"]]
        lib[call["func"]](*args, *outs)
        for o, t in zip(call["outputs"], outs):
            np.save(o["path"], t.numpy())


if __name__ == "__main__":
    main(sys.argv[1])
