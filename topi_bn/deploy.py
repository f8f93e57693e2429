"""Production builds of whole models: ``topi-bn compile`` and ``topi-bn run``.

``topi-bn compile MODEL.onnx|EXPORTED.pt2 --target T --bn MODE -o model.so`` imports the model
(:func:`load_model`: ONNX through :func:`topi_bn.from_onnx`, a ``torch.export.save`` file
through :func:`topi_bn.from_exported_program`), builds it with :func:`topi_bn.build_with_report`
(shipped tuning logs plus the user's) and writes a shared library, linked by this machine's C
compiler or, for another architecture (an ARM target on x86), by its cross compiler
(:func:`library_compiler`: ``aarch64-linux-gnu-gcc``). The library needs nothing but TVM's
runtime (``tvm.runtime.vm``, unlike ``tvm.relax``, works without TVM's compiler library)::

    import numpy as np, tvm
    from tvm.runtime.vm import VirtualMachine
    vm = VirtualMachine(tvm.runtime.load_module("model.so"), tvm.cpu())
    y = vm["main"](tvm.runtime.tensor(np.load("x.npy")))  # a tuple from torch.export

with ``TVM_NUM_THREADS`` set to the machine's physical cores (TVM's runtime alone takes half the
logical CPUs on x86: :mod:`topi_bn.threads`).
``topi-bn run model.so --input x.npy`` does the same (:func:`run_library`, which imports no
compiler part of topi-bn) for a library of this machine's architecture;
:func:`topi_bn.arm_emulation.run_library_under_qemu` runs an aarch64 one on x86.
"""
from __future__ import annotations

import os
import platform
import shutil
import struct
import tempfile
import warnings
from typing import Any, Callable, Mapping, Sequence

# .build and .relax (TVM's compiler) are imported where a model is loaded or built, so that
# run_library works with TVM's runtime alone (on a board)
from .dtypes import check_dtype
from .rpc import cross_compiler_for
from .targets import resolve, tuning_log_key

__all__ = ["MODEL_FORMATS", "load_model", "library_compiler", "compile_model",
           "library_arch", "run_library", "model_format"]

#: File suffix -> what it holds.
MODEL_FORMATS = {".onnx": "ONNX model (onnx.save)", ".pt2": "torch.export.save program"}


def model_format(path: str, arg: str) -> str:
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in MODEL_FORMATS:
        raise ValueError(f"{arg}: expected a {' or '.join(MODEL_FORMATS)} file, got {path!r} "
                         f"(unknown format {suffix or 'without a suffix'!r})")
    if not os.path.isfile(path):
        raise ValueError(f"{arg}: no such file: {path!r}")
    return suffix


def load_model(path: str, arg: str = "model", onnx_dims: Mapping[str, int] | None = None):
    """The Relax module of the model file ``path``.

    ``.onnx``: ``onnx.load`` -> :func:`topi_bn.from_onnx`, the inputs' symbolic dimensions named
    in ``onnx_dims`` set to their sizes first (so that the importer writes every kernel for the
    static shape); ``.pt2``: ``torch.export.load`` ->
    :func:`topi_bn.from_exported_program` (parameters as constants, the model's outputs only:
    no buffer updates). Raises ValueError (naming ``arg``) for a missing file, an unknown
    suffix or a file the reader cannot parse.
    """
    from .build import check_shape_vars  # the compiler: see the imports
    from .relax import from_exported_program, from_onnx

    suffix = model_format(path, arg)
    if suffix == ".onnx":
        import onnx

        try:
            model = onnx.load(path)
        except Exception as err:  # noqa: BLE001 -- protobuf raises several kinds
            raise ValueError(f"{arg}: {path!r} is not a readable ONNX model ({_first(err)})") \
                from err
        dims = [d for i in model.graph.input for d in i.type.tensor_type.shape.dim
                if d.HasField("dim_param")]
        sizes = check_shape_vars(onnx_dims, [d.dim_param for d in dims])
        for d in dims:
            if d.dim_param in sizes:
                d.dim_value = sizes[d.dim_param]  # replaces the dim_param
        return from_onnx(model)
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations
            ep = torch.export.load(path)
    except Exception as err:  # noqa: BLE001 -- zip, pickle and version errors
        raise ValueError(f"{arg}: {path!r} is not a torch.export.save file ({_first(err)})") \
            from err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return from_exported_program(ep, keep_buffer_updates=False)


def _first(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[0] if lines else type(err).__name__


def library_compiler(target: Any, arg: str = "target") -> str | None:
    """The C compiler that links the library for ``target``: None for this machine's (TVM's
    default), the cross compiler for another architecture (``aarch64-linux-gnu-gcc`` for the ARM
    targets on x86; :func:`topi_bn.rpc.cross_compiler_for`).

    Raises ValueError, naming ``arg``, when that cross compiler is not on PATH or none is known
    for the target's architecture.
    """
    try:
        compiler = cross_compiler_for(target)
    except ValueError as err:
        raise ValueError(f"{arg}: {err}") from None
    if compiler is not None and shutil.which(compiler) is None:
        arch = compiler.split("-")[0]
        raise ValueError(f"{arg}: building for {arch} needs the cross compiler {compiler} on "
                         f"PATH (Debian/Ubuntu: apt-get install "
                         f"gcc-{compiler.removesuffix('-gcc')})")
    return compiler


def compile_model(model: str, output: str, target: Any, bn: str = "fused",
                  tuning_logs: Sequence[str] = (), shipped: bool = True,
                  progress: Callable[[str], None] | None = None, dtype: str = "float32",
                  shape_vars: Mapping[str, int] | None = None):
    """Import ``model``, build it for ``target`` and write the shared library ``output``.

    Parameters
    ----------
    model : str
        A ``.onnx`` or ``.pt2`` file (:func:`load_model`).
    output : str
        The library to write (``.so``); written through a temporary file beside it and moved
        into place only when complete, so a failed build leaves an existing file untouched.
    target : Target, dict or str
        Anything :func:`topi_bn.resolve_target` accepts. A target of another architecture
        (``arm``, ``arm/rasp4b64``) is linked with its cross compiler
        (:func:`library_compiler`).
    bn : {"fused", "folded", "unpacked", "opaque"}
    tuning_logs : sequence of str
        The user's MetaSchedule log directories; they win over the shipped ones.
    shipped : bool
        Also apply the package's logs for the target.
    progress : callable, optional
        Called with one line per step.
    dtype : {"float32", "bfloat16"}
        As in :func:`topi_bn.build`: ``"bfloat16"`` keeps the library's float32 inputs and
        outputs and runs bf16 activations and weights inside.
    shape_vars : dict, optional
        As in :func:`topi_bn.build`: sizes of the model's symbolic input dimensions (a dynamic
        batch), which the library is then built for.

    Returns
    -------
    topi_bn.build.BuildReport
    """
    from tvm.support import cc

    from .build import (  # the compiler: see the imports
        SymbolicShapeWarning, build_with_report, shipped_log_dir,
    )

    say = progress or (lambda _line: None)
    check_dtype(dtype)
    target = resolve(target, arg_name="target")  # once; passed down as it is
    compiler = library_compiler(target)
    onnx_file = model_format(model, "model") == ".onnx"
    out_dir = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(out_dir):
        raise ValueError(f"output: folder {out_dir!r} does not exist")
    if os.path.abspath(output) == os.path.abspath(model):
        raise ValueError("output: would overwrite the model; name another file")
    for d in tuning_logs:
        if not os.path.isdir(d):
            raise ValueError(f"tuning_logs: no such directory: {d!r}")
    say(f"[1/3] importing {model}")
    mod = load_model(model, onnx_dims=shape_vars if onnx_file else None)
    if onnx_file:
        shape_vars = None  # bound at import
    logs = list(tuning_logs) + (["shipped"] if shipped else [])
    key = tuning_log_key(target)
    say(f"[2/3] building for {key} (bn={bn}" + (f", dtype={dtype})" if dtype != "float32"
                                                  else ")"))
    if shipped and not os.path.isdir(shipped_log_dir(target)):
        say(f"note: topi-bn ships no tuning log for {key}: kernels without a record of "
            f"--tuning-logs use default schedules")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ex, report = build_with_report(mod, target, bn=bn, tuning_logs=logs, dtype=dtype,
                                       shape_vars=shape_vars)
    for w in caught:  # a dynamic batch: a progress line; anything else as it came
        if progress is not None and issubclass(w.category, SymbolicShapeWarning):
            say(f"warning: {w.message}")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    say(f"[3/3] writing {output}")
    tmp_dir = tempfile.mkdtemp(dir=out_dir, prefix=".topi-bn-")
    try:
        tmp = os.path.join(tmp_dir, os.path.basename(output))
        ex.export_library(tmp, fcompile=cc.cross_compiler(compiler) if compiler else None)
        os.replace(tmp, output)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return report


#: ELF ``e_machine`` -> the architecture's name as ``platform.machine()`` spells it on Linux.
_ELF_MACHINES = {3: "i386", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv64"}


def library_arch(path: str) -> str | None:
    """The architecture the ELF shared library ``path`` is built for (``"x86_64"``,
    ``"aarch64"``, ...; ``"ELF machine N"`` for others), or None when it is not an ELF file."""
    with open(path, "rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    (machine,) = struct.unpack("<H" if head[5] == 1 else ">H", head[18:20])  # EI_DATA: 1 = LE
    return _ELF_MACHINES.get(machine, f"ELF machine {machine}")


def run_library(library: str, inputs: Sequence[str], device: str = "cpu") -> list:
    """Run ``main`` of a library written by :func:`compile_model` on ``.npy`` inputs.

    Uses TVM's runtime only (``tvm.runtime.load_module`` and ``tvm.runtime.vm``'s Relax VM).
    Returns the outputs as NumPy arrays. Raises ValueError, naming the argument, for a missing
    or unreadable file and for a library of another architecture than this machine's (an
    aarch64 one on x86: run it on the board, or under qemu with
    :func:`topi_bn.arm_emulation.run_library_under_qemu`).
    """
    import numpy as np
    import tvm
    from tvm.runtime.vm import VirtualMachine

    if not os.path.isfile(library):
        raise ValueError(f"library: no such file: {library!r}")
    arch, host = library_arch(library), platform.machine().lower()
    if arch is not None and arch != {"amd64": "x86_64", "arm64": "aarch64"}.get(host, host):
        raise ValueError(f"library: {library!r} is built for {arch}, not for this machine "
                         f"({host}); run it on the device, with the TVM runtime")
    arrays = []
    for path in inputs:
        if not os.path.isfile(path):
            raise ValueError(f"--input: no such file: {path!r}")
        try:
            arrays.append(np.load(path, allow_pickle=False))
        except Exception as err:  # noqa: BLE001 -- a file that is not a .npy array
            raise ValueError(f"--input: {path!r} is not a .npy array ({_first(err)})") from err
    try:
        lib = tvm.runtime.load_module(library)
    except Exception as err:  # noqa: BLE001 -- TVM raises its own error kinds
        raise ValueError(f"library: cannot load {library!r} ({_first(err)})") from err
    dev = tvm.device(device)
    vm = VirtualMachine(lib, dev)
    try:
        out = vm["main"](*[tvm.runtime.tensor(a, dev) for a in arrays])
    except Exception as err:  # noqa: BLE001 -- wrong count, shape or dtype of the inputs
        raise ValueError(f"--input: the model rejected the inputs "
                         f"({', '.join(f'{a.dtype}{list(a.shape)}' for a in arrays)}): "
                         f"{_first(err)}") from err
    return [o.numpy() for o in _flatten(out)]


def _flatten(out) -> list:
    import tvm

    if isinstance(out, tvm.runtime.Tensor):
        return [out]
    return [t for o in out for t in _flatten(o)]
