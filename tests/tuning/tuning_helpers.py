"""Shared by test_tune.py, test_tune_verify.py and test_build.py: one tiny real tuning run per
test session."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

# the smallest registry workload with a multi-block template (5 blocks, several knobs)
WORKLOAD = "smoke.layer_norm_16x64"
TRIALS = 2
# what one tuning run writes per workload: the searched candidates and the default schedule
RECORDS = TRIALS + 1
# The tuned log is made for a named ISA, never for "x86" (this host): the project's machines
# differ (AVX2-only and AVX-512), and which records apply must not change with them. Code for
# x86-avx2 runs on all of them.
TARGET = "x86-avx2"
# another CPU with the same log key (x86-avx2): TARGET's records apply to it
SAME_KEY_TARGET = {"kind": "llvm", "mcpu": "znver3"}
# a target of another log key: TARGET's records never apply (only scheduled here, never run)
OTHER_KEY_TARGET = "x86-avx512"
_CACHE: dict[str, str] = {}


def tuned_log_dir() -> str:
    """A log directory holding a real ``template``-space tuning of :data:`WORKLOAD` (made once
    per session; copy it before changing it). The tests that use it are marked
    ``@pytest.mark.requires("avx2")``: it is measured on this CPU."""
    if "dir" not in _CACHE:
        from topi_bn.tuning import tune

        root = tempfile.mkdtemp(prefix="topi_bn_test_tuned_")
        log = os.path.join(root, "log")
        results = tune(TARGET, WORKLOAD, trials=TRIALS, log_dir=log, space="template",
                       progress=None)
        assert [r.status for r in results] == ["tuned"]
        _CACHE["dir"] = log
    return _CACHE["dir"]


def copy_log(dst: str) -> str:
    shutil.copytree(tuned_log_dir(), dst)
    return dst


def dir_digest(path: str) -> dict[str, str]:
    """File name -> sha256 of every file under ``path``."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = hashlib.sha256(fh.read()).hexdigest()
    return out
