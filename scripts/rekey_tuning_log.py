"""Carry a tuning log's records over to changed computes, without re-measuring them.

When a compute changes, the PrimFunc it emits changes and its records stop matching (the build
then uses the default schedule). Where the change leaves the loop nest alone (an epilogue
expression, say), each record's schedule trace still replays on the new PrimFunc. This script
replays every record of every registry workload named in the log's resume manifest on the
workload's current PrimFunc, and rewrites the log with the records that replay, keyed to the
current PrimFuncs. Records that no longer replay are dropped, and so is the manifest entry of a
workload left with none (``topi-bn tune`` then tunes it again).

The run times stay those measured for the old compute: say so in the log's README. Re-tune on
a machine of the log's ISA when one is at hand.

    python scripts/rekey_tuning_log.py tuning_logs/x86-avx512 --target x86-avx512
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile


def rekey(log_dir: str, target) -> dict[str, str]:
    """Rewrite ``log_dir`` in place; returns workload name -> what happened to it."""
    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    from topi_bn.targets import resolve_target
    from topi_bn.tuning import build_visible_mod, workload_prim_func
    from topi_bn.tuning_db import MANIFEST_FILE, merge_records, read_manifest

    t = resolve_target(target)
    manifest = read_manifest(log_dir)
    old = ms.database.JSONDatabase(work_dir=log_dir, allow_missing=False)
    by_hash = {}
    for rec in old.get_all_tuning_records():
        h = tvm_ffi.structural_hash(rec.workload.mod) & 0xFFFFFFFFFFFF
        by_hash.setdefault(f"{h:x}", []).append(rec)
    tmp = tempfile.mkdtemp(prefix=".rekey-", dir=os.path.dirname(os.path.abspath(log_dir)))
    report, kept_manifest = {}, {}
    try:
        for key, entry in sorted(manifest.items()):
            name, dtype, old_hash = entry["workload"], entry["dtype"], key.rsplit("|", 1)[-1]
            records = by_hash.get(old_hash, [])
            mod = build_visible_mod(workload_prim_func(name, dtype, target=t))
            new_hash = f"{tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFF:x}"
            if new_hash == old_hash:
                replayed, status = records, "unchanged"
            else:
                replayed = []
                for rec in records:
                    sch = tvm.s_tir.Schedule(mod)
                    try:
                        rec.trace.apply_to_schedule(sch, remove_postproc=False)
                    except Exception:  # noqa: BLE001 - a trace that no longer replays
                        continue
                    replayed.append(rec)
                status = f"re-keyed {len(replayed)} of {len(records)} records"
            if replayed:
                merge_records(tmp, mod, replayed)
                kept_manifest[key.rsplit("|", 1)[0] + "|" + new_hash] = entry
            else:
                status = f"dropped: none of {len(records)} records replays"
            report[name] = status
        with open(os.path.join(tmp, MANIFEST_FILE), "w", encoding="utf-8") as f:
            json.dump(kept_manifest, f, indent=1, sort_keys=True)
            f.write("\n")
        for fname in ("database_workload.json", "database_tuning_record.json", MANIFEST_FILE):
            os.replace(os.path.join(tmp, fname), os.path.join(log_dir, fname))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log_dir")
    p.add_argument("--target", required=True, help="the log's target (x86-avx512, x86-avx2, ...)")
    args = p.parse_args(argv)
    for name, status in rekey(args.log_dir, args.target).items():
        print(f"{name}: {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
