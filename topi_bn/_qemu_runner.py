"""Runner executed by the aarch64 Python under qemu-aarch64 (see topi_bn.arm_emulation).

Standalone on purpose: it imports only numpy and the TVM runtime, never topi_bn (whose
package import needs the TVM compiler, which the sysroot does not ship).
Usage: python _qemu_runner.py SPEC.json with either
SPEC = {so, calls: [{func, inputs: [npy path], outputs: [{path, shape, dtype}]}]}
    (destination-passing PrimFuncs called directly), or
SPEC = {so, vm: {func, inputs: [npy path], out_dir}}
    (a Relax library run by the runtime's VM; writes out_dir/out{i}.npy, the outputs flattened,
    and out_dir/outputs.json = {count}).
"""
import json
import os
import sys

import numpy as np
import tvm


def run_vm(lib, vm_spec, dev):
    # tvm.runtime.vm, not tvm.relax: the latter needs the compiler library the sysroot lacks
    from tvm.runtime.vm import VirtualMachine

    vm = VirtualMachine(lib, dev)
    out = vm[vm_spec["func"]](*[tvm.runtime.tensor(np.load(p), dev) for p in vm_spec["inputs"]])
    outs = flatten(out)
    for i, t in enumerate(outs):
        np.save(os.path.join(vm_spec["out_dir"], f"out{i}.npy"), t.numpy())
    with open(os.path.join(vm_spec["out_dir"], "outputs.json"), "w") as f:
        json.dump({"count": len(outs)}, f)


def flatten(out):
    if isinstance(out, tvm.runtime.Tensor):
        return [out]
    return [t for o in out for t in flatten(o)]


def main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    dev = tvm.cpu(0)
    lib = tvm.runtime.load_module(spec["so"])
    if "vm" in spec:
        run_vm(lib, spec["vm"], dev)
        return
    for call in spec["calls"]:
        args = [tvm.runtime.tensor(np.load(p), dev) for p in call["inputs"]]
        outs = [tvm.runtime.tensor(np.zeros(o["shape"], o["dtype"]), dev) for o in call["outputs"]]
        lib[call["func"]](*args, *outs)
        for o, t in zip(call["outputs"], outs):
            np.save(o["path"], t.numpy())


if __name__ == "__main__":
    main(sys.argv[1])
