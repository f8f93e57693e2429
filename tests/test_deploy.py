"""``topi-bn compile`` / ``topi-bn run``: a model file to a shared library that runs with TVM's
runtime alone."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from topi_bn import cli
from topi_bn.testing import assert_close

torch = pytest.importorskip("torch")

TARGET = "x86-avx2"  # runs on every x86 host of the project
#: Runs the library with the TVM runtime and the Relax VM only: no topi_bn import.
RUNNER = """
import sys, numpy as np, tvm
from tvm import relax
vm = relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())
out = vm["main"](tvm.runtime.tensor(np.load(sys.argv[2])))
np.save(sys.argv[3], (out if isinstance(out, tvm.runtime.Tensor) else out[0]).numpy())
assert not any(m.startswith("topi_bn") for m in sys.modules)
"""


def _tiny_net():
    from topi_bn.testing.models import randomize_bn

    nn = torch.nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=True)
            self.bn2 = nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = nn.functional.relu6(self.bn2(self.conv2(y)))
            return self.fc(y.mean((2, 3)))

    torch.manual_seed(0)
    return randomize_bn(Tiny()).eval()


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("deploy")
    net = _tiny_net()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 8, 8))
                         .astype("float32"))
    with torch.no_grad():
        ref = net(x).numpy()
    np.save(d / "x.npy", x.numpy())
    torch.export.save(torch.export.export(net, (x,)), d / "tiny.pt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), d / "tiny.onnx", dynamo=False, opset_version=17,
                          do_constant_folding=False)
    return d, ref


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
    (["compile", "{d}/bad.onnx", "-o", "{d}/m.so"], "not a readable ONNX model"),
    (["run", "{d}/missing.so", "--input", "{d}/x.npy"], "library: no such file"),
    (["run", "{d}/tiny.onnx", "--input", "{d}/missing.npy"], "--input: no such file"),
])
def test_bad_input_is_one_line(model_files, capsys, argv, message):
    d, _ = model_files
    (d / "bad.onnx").write_bytes(b"not a model")
    (d / "m.so").write_bytes(b"the user's file")
    with pytest.raises(SystemExit) as exc:
        cli.main([a.format(d=d) for a in argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert (d / "m.so").read_bytes() == b"the user's file"  # never overwritten on failure
