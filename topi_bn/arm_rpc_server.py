"""In-process TVM RPC server that works under qemu-user.

``python -m tvm.exec.rpc_server`` starts its listener by re-executing ``sys.executable``,
which fails under qemu-user without binfmt_misc. This server runs TVM's listen loop in the
current process instead (sessions are forked, which qemu-user supports). It imports only the
TVM runtime, so it runs with the runtime-only aarch64 sysroot:

    qemu-aarch64 -L SYSROOT SYSROOT/usr/bin/python3.11 -P topi_bn/arm_rpc_server.py \\
        --tracker 127.0.0.1:9190 --key qemu-aarch64

(``topi_bn.arm_emulation.start_rpc_server`` does exactly that.) On a real board use TVM's own
``python -m tvm.exec.rpc_server --tracker HOST:9190 --key KEY``.
"""
import argparse
import ctypes
import logging
import socket
import sys
from pathlib import Path

import tvm
from tvm.rpc.server import _listen_loop  # runtime-only import


def load_runtime_extra():
    """Load libtvm_runtime_extra, which ``import tvm`` skips in runtime-only mode.

    It holds ``tvm.contrib.random.random_fill_for_measure``, which MetaSchedule's RPCRunner
    calls on the server to fill the kernel arguments.
    """
    from tvm.base import _LOADED_LIBS

    if "tvm_runtime_extra" in _LOADED_LIBS:
        return
    lib = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent / "libtvm_runtime_extra.so"
    if lib.is_file():
        _LOADED_LIBS["tvm_runtime_extra"] = ctypes.CDLL(str(lib), ctypes.RTLD_GLOBAL)
    if tvm.get_global_func("tvm.contrib.random.random_fill_for_measure", allow_missing=True) is None:
        logging.warning("tvm.contrib.random.random_fill_for_measure is missing: "
                        "MetaSchedule's RPCRunner cannot allocate arguments on this server")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tracker", required=True, help="tracker address HOST:PORT")
    p.add_argument("--key", required=True, help="device key to register under")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=9090, help="first port to try")
    p.add_argument("--port-end", type=int, default=9199, help="last port to try")
    args = p.parse_args(argv)
    host, _, port = args.tracker.rpartition(":")
    if not host or not port.isdigit():
        p.error(f"--tracker must be HOST:PORT, got {args.tracker!r}")
    logging.basicConfig(level=logging.INFO)
    load_runtime_extra()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for my_port in range(args.port, args.port_end + 1):
        try:
            sock.bind((args.host, my_port))
            break
        except OSError:
            continue
    else:
        sys.exit(f"no free port in {args.port}..{args.port_end}")
    sock.listen(1)
    print(f"arm_rpc_server: listening on {args.host}:{my_port}, key {args.key!r}, "
          f"tracker {host}:{port}", flush=True)
    # custom_addr=None: the tracker records the address this server connects from.
    _listen_loop(sock, my_port, args.key, (host, int(port)), None, None)


if __name__ == "__main__":
    main()
