"""``topi-bn compile`` / ``topi-bn run``: a model file to a shared library that runs with TVM's
runtime alone."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import topi_bn
from topi_bn import cli
from topi_bn.testing import assert_close

torch = pytest.importorskip("torch")

TARGET = "x86-avx2"  # runs on every x86 host of the project
#: Runs the library with the TVM runtime and its Relax VM only: no topi_bn import (the README's
#: snippet; ``tvm.runtime.vm`` works where the TVM compiler is not installed).
RUNNER = """
import sys, numpy as np, tvm
from tvm.runtime.vm import VirtualMachine
vm = VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())
out = vm["main"](tvm.runtime.tensor(np.load(sys.argv[2])))
np.save(sys.argv[3], (out if isinstance(out, tvm.runtime.Tensor) else out[0]).numpy())
assert not any(m.startswith("topi_bn") for m in sys.modules)
"""


@pytest.mark.parametrize("fmt,bn", [("pt2", "fused"), ("onnx", "folded")])
def test_compile_then_run_in_a_fresh_process(model_files, capsys, fmt, bn):
    d, ref = model_files
    lib = d / f"tiny-{fmt}.so"
    assert cli.main(["compile", str(d / f"tiny.{fmt}"), "--target", TARGET, "--bn", bn,
                     "-o", str(lib)]) == 0
    out, err = capsys.readouterr()
    assert "[1/3] importing" in err and "[3/3] writing" in err
    assert f"2 batch-norms: 2 {bn}" in out and "topi-bn kernels:" in out
    # the TVM runtime alone, in a new process
    y = d / f"y-{fmt}.npy"
    subprocess.run([sys.executable, "-c", RUNNER, str(lib), str(d / "x.npy"), str(y)],
                   check=True, env={**os.environ, "PYTHONPATH": ""})
    assert_close(np.load(y), ref, "float32", f"{fmt} {bn}")
    # and through `topi-bn run`
    y2 = d / f"y2-{fmt}.npy"
    assert cli.main(["run", str(lib), "--input", str(d / "x.npy"), "-o", str(y2)]) == 0
    np.testing.assert_array_equal(np.load(y2), np.load(y))


@pytest.mark.parametrize("bn", ["fused", "folded"])
def test_compile_bfloat16_keeps_float32_io(model_files, capsys, bn):
    """``--dtype bfloat16``: the library takes and returns float32, bf16 inside; its output
    within bf16's error of PyTorch (tiny_conv_bn: 4 logits)."""
    from topi_bn.testing import assert_close_to_range

    d, ref = model_files
    lib = d / f"tiny-bf16-{bn}.so"
    assert cli.main(["compile", str(d / "tiny.pt2"), "--target", TARGET, "--bn", bn,
                     "--dtype", "bfloat16", "-o", str(lib)]) == 0
    assert f"(bn={bn}, dtype=bfloat16)" in capsys.readouterr().err
    y = d / f"y-bf16-{bn}.npy"
    assert cli.main(["run", str(lib), "--input", str(d / "x.npy"), "-o", str(y)]) == 0
    out = np.load(y)
    assert out.dtype == np.float32
    assert_close_to_range(out, ref, "bfloat16", tol=2.0 ** -7)


def test_compile_binds_a_dynamic_batch(model_files, capsys):
    """An ONNX model with a dynamic batch: ``--shape-var batch=1`` builds it for batch 1 (on
    topi-bn's kernels, no symbolic-shape warning); without it the build warns and names the
    option."""
    d, ref = model_files
    lib = d / "tiny-dyn.so"
    with warnings.catch_warnings():
        warnings.simplefilter("error", topi_bn.SymbolicShapeWarning)
        assert cli.main(["compile", str(d / "tiny-dyn.onnx"), "--target", TARGET,
                         "--shape-var", "batch=1", "-o", str(lib)]) == 0
    y = d / "y-dyn.npy"
    assert cli.main(["run", str(lib), "--input", str(d / "x.npy"), "-o", str(y)]) == 0
    assert_close(np.load(y), ref, "float32", "dynamic batch bound to 1")
    capsys.readouterr()
    assert cli.main(["compile", str(d / "tiny-dyn.onnx"), "--target", TARGET,
                     "-o", str(d / "tiny-dyn-generic.so")]) == 0
    err = capsys.readouterr().err
    assert "\nwarning: the model's inputs have symbolic dimensions (batch)" in err
    assert "--shape-var" in err and "Traceback" not in err


def test_no_batch_norm_model_is_compiled_with_a_note(tmp_path, capsys):
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    x = torch.zeros((1, 3, 5, 5))
    torch.export.save(torch.export.export(net, (x,)), tmp_path / "plain.pt2")
    assert cli.main(["compile", str(tmp_path / "plain.pt2"), "--target", TARGET,
                     "-o", str(tmp_path / "plain.so")]) == 0
    assert "nothing to fuse or fold" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["compile", "{d}/missing.onnx", "-o", "{d}/m.so"], "MODEL: no such file"),
    (["compile", "{d}/x.npy", "-o", "{d}/m.so"], "MODEL: expected a .onnx or .pt2 file"),
    (["compile", "{d}/tiny.onnx", "-o", "{d}/no/such/m.so"], "--output: folder"),
    (["compile", "{d}/tiny.onnx", "--tuning-logs", "{d}/nologs", "-o", "{d}/m.so"],
     "--tuning-logs: no such directory"),
    (["compile", "{d}/tiny.onnx", "--target", "nosuch", "-o", "{d}/m.so"], "--target"),
    (["compile", "{d}/tiny.onnx", "--dtype", "float16", "-o", "{d}/m.so"], "--dtype"),
    (["compile", "{d}/tiny.onnx", "--dtype", "bfloat16", "--bn", "unpacked", "-o",
      "{d}/m.so"], "--dtype: bfloat16 builds need --bn fused or folded"),
    (["compile", "{d}/bad.onnx", "-o", "{d}/m.so"], "not a readable ONNX model"),
    (["compile", "{d}/tiny-dyn.onnx", "--shape-var", "batch", "-o", "{d}/m.so"],
     "--shape-var: expected NAME=SIZE"),
    (["compile", "{d}/tiny-dyn.onnx", "--shape-var", "batch=0", "-o", "{d}/m.so"],
     "--shape-var: expected NAME=SIZE with a size >= 1"),
    (["compile", "{d}/tiny-dyn.onnx", "--shape-var", "n=1", "-o", "{d}/m.so"],
     "shape_vars: 'n' is not a symbolic dimension of the model's inputs (they have: batch)"),
    (["run", "{d}/missing.so", "--input", "{d}/x.npy"], "library: no such file"),
    (["run", "{d}/tiny.onnx", "--input", "{d}/missing.npy"], "--input: no such file"),
    (["run", "{d}/riscv.so", "--input", "{d}/x.npy"],
     "is built for riscv64, not for this machine"),
])
def test_bad_input_is_one_line(model_files, capsys, argv, message):
    d, _ = model_files
    (d / "bad.onnx").write_bytes(b"not a model")
    # the header of a 64-bit little-endian ELF shared object for RISC-V (e_machine 243)
    (d / "riscv.so").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x03\x00\xf3\x00"
                                 + bytes(44))
    (d / "m.so").write_bytes(b"the user's file")
    with pytest.raises(SystemExit) as exc:
        cli.main([a.format(d=d) for a in argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert (d / "m.so").read_bytes() == b"the user's file"  # never overwritten on failure


def test_cross_target_without_its_compiler_is_one_line(model_files, tmp_path, monkeypatch,
                                                       capsys):
    d, _ = model_files
    monkeypatch.setenv("PATH", str(tmp_path))  # no aarch64-linux-gnu-gcc here
    with pytest.raises(SystemExit) as exc:
        cli.main(["compile", str(d / "tiny.onnx"), "--target", "arm", "-o",
                  str(tmp_path / "m.so")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--target: building for aarch64 needs the cross compiler aarch64-linux-gnu-gcc" in err
    assert "Traceback" not in err and not (tmp_path / "m.so").exists()
