"""Tuning logs on disk: read them without touching them, and merge new records into them safely.

A tuning log is a MetaSchedule JSON database directory::

    <dir>/database_workload.json        one line per workload:  [structural hash, workload JSON]
    <dir>/database_tuning_record.json   one line per record:    [workload line index, record JSON]
    <dir>/topi_bn_tuning.json           what ``topi-bn tune`` has finished (its resume manifest)

Reading (:func:`load_logs`) parses the files line by line into an in-memory
``ms.database.MemoryDatabase``, a workload's records when a build first asks for that workload
(:class:`LoadedLogs`: parsing a record replays its trace); the files are opened read-only, so a
build never changes a log.
``_parse_log`` is the one parser of a log: :func:`drop_records` reads through it too.
A missing, empty, truncated or corrupt file gives a :class:`TuningLogWarning` naming the file and
the lines that were skipped; the other records still load.

Writing (:func:`merge_records`) happens under an exclusive ``fcntl.flock`` on
``<dir>/.topi_bn.lock``: the current files are copied into a private folder inside ``<dir>``, the
new records are appended there through ``ms.database.JSONDatabase``, and the files are moved back
with ``os.replace``. Two tuners that share a directory therefore lose no records, and a tuner
killed mid-merge leaves the previous log intact. :func:`drop_records` removes records the same
way (``topi-bn tune --verify`` drops tuned records that lose to the default schedule).

Which records apply to a build (:func:`load_logs`):

- target: a record applies when its target has the build target's kind and
  :func:`topi_bn.targets.record_scope`: the same :func:`~topi_bn.targets.tuning_log_key`
  (x86-avx512, x86-avx2, arm-neon, cuda-sm_XX) and, on AVX-512, the same
  :func:`~topi_bn.targets.x86_cores` (records tuned on AMD's Zen 4 / Zen 5 do not apply
  to Intel's cores, nor the other way: their fastest register tiles differ, and on a Sapphire
  Rapids the Intel default schedules ran most ResNet-50 convs faster than the Zen 5 records); a
  schedule tuned on one AVX-512 CPU is valid code for any other, except one whose micro-kernel
  inlines ``vdpbf16ps``, which applies only to targets with AVX512_BF16 and vector pipes of
  the width it was timed on (a Zen 5's records not on a Zen 4:
  :func:`topi_bn.schedules.rules.trace_runs_on`); the tensor intrinsics a record's trace
  names are registered before it is parsed (parsing replays the trace);
- pipes: of the records of a workload that apply, those timed on vector pipes of the build
  CPU's width (:func:`tuning_scope`: a Zen 4 runs its 512-bit registers on 256-bit pipes, a
  Zen 5 on 512-bit ones) are the ones used where there are any (:func:`preferred_records`);
  a Zen 4 builds on its own records where it has them, else on a Zen 5's;
- failed measurements (MetaSchedule's 1e10 s) are dropped;
- several logs: for each workload the records come from the first log, in priority order, that
  has a valid record for it. User logs come before the shipped one, so a user's records win over
  shipped ones; run times measured on different machines are not compared.
"""
# Long because: the log format's one reader (records parsed on demand) and its locked writers.
from __future__ import annotations

import contextlib
import fcntl
import io
import json
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from .schedules.helpers import datapath_bits
from .schedules.rules import register_record_intrinsics, trace_runs_on
from .targets import record_scope, resolve, resolve_target, tuning_log_key, vector_bits

__all__ = [
    "WORKLOAD_FILE", "RECORD_FILE", "MANIFEST_FILE", "LOCK_FILE", "TuningLogWarning",
    "LoadedLogs", "load_logs", "merge_records", "drop_records", "read_manifest", "log_lock",
    "record_applies", "tuning_record_applies", "tuning_scope", "preferred_records", "run_time",
    "build_visible_mod",
]

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
MANIFEST_FILE = "topi_bn_tuning.json"
LOCK_FILE = ".topi_bn.lock"

# MetaSchedule stores a failed build or run as this many seconds.
_FAILED_SECS = 1e9

logger = logging.getLogger("topi_bn")


class TuningLogWarning(UserWarning):
    """A tuning log could not be read, entirely or in part; the build uses default schedules for
    what it lacks."""


@dataclass
class LoadedLogs:
    """Records of one or more logs, merged into one in-memory database as builds ask for them.

    Parsing a record replays its trace on its workload (about 10 ms each: the 2054 records of
    the shipped x86-avx2 log took 20 s on a Zen 3), and a build needs the records of the few
    dozen kernels it compiles. So reading a log parses its workloads and checks its record
    lines, and the records of a workload are parsed the first time a build asks for it
    (:meth:`prepare`, which the build's database calls before every query).

    Attributes
    ----------
    database : ms.database.MemoryDatabase
        The records parsed so far that apply to the target.
    sources : list of str
        The log directories read, in priority order.
    num_records : int
        Records that apply to the target (parses them all).
    skipped : dict
        Per log directory, how many records were dropped because an earlier log had the workload
        (``"shadowed"``), they were for another target (``"other_target"``), the workload has
        records timed on the target's vector pipes and they were not (``"other_pipes"``,
        :func:`preferred_records`) or they failed (``"failed"``) (parses them all).
    """

    database: object
    sources: list[str] = field(default_factory=list)
    target: object = None
    # structural hash of a workload -> [(log dir, workload, record lines)], in priority order
    pending: dict = field(default_factory=dict, repr=False)
    counts: dict = field(default_factory=dict, repr=False)
    committed: int = 0  # records committed to the database so far

    def prepare(self, mod) -> None:
        """Parse and commit the records of ``mod``'s workload (once)."""
        import tvm_ffi

        entries = self.pending.pop(tvm_ffi.structural_hash(mod), None)
        for log_dir, workload, lines in entries or ():
            _commit_records(self, log_dir, workload, lines)

    def prepare_all(self) -> None:
        while self.pending:
            for log_dir, workload, lines in self.pending.pop(next(iter(self.pending))):
                _commit_records(self, log_dir, workload, lines)

    @property
    def num_records(self) -> int:
        self.prepare_all()
        return self.committed

    @property
    def skipped(self) -> dict[str, dict[str, int]]:
        self.prepare_all()
        return self.counts


def _warn(msg: str) -> None:
    warnings.warn(msg, TuningLogWarning, stacklevel=3)


def _target_key(target) -> tuple[str, str] | None:
    try:
        return (resolve_target(target).kind.name, record_scope(target))
    except Exception:  # a target topi-bn has no log key for
        return None


def record_applies(record_target, build_target) -> bool:
    """Whether a record tuned for ``record_target`` applies to a build for ``build_target``: same
    target kind and :func:`~topi_bn.targets.record_scope` (``build_target`` is best a
    :class:`~topi_bn.targets.ResolvedTarget`, whose log key is computed once)."""
    if record_target is None:
        return False
    want = _target_key(build_target)
    return want is not None and _target_key(record_target) == want


def tuning_record_applies(rec, build_target) -> bool:
    """Whether the tuning record ``rec`` applies to a build for ``build_target`` (resolved):
    its target does (:func:`record_applies`), and so does the code its trace schedules, as it
    was timed (:func:`~topi_bn.schedules.rules.trace_runs_on`)."""
    return record_applies(rec.target, build_target) and \
        trace_runs_on(rec.trace, build_target.target, tuned_on=rec.target)


_TUNING_SCOPES: dict[str, str] = {}


def tuning_scope(target) -> str:
    """Whose timings a record of ``target`` holds: its :func:`~topi_bn.targets.record_scope`,
    with ``"@dp<bits>"`` appended for a CPU whose vector pipes are narrower than its registers
    (:attr:`CpuParams.datapath_bits <topi_bn.schedules.helpers.CpuParams>`: Zen 4,
    ``x86-avx512@dp256``). The resume manifest of ``topi-bn tune`` keys a workload's trials by
    it, and a build prefers the records of its own (:func:`preferred_records`). Kept per
    target (the log loader asks once per record; working it out takes about 0.6 ms)."""
    t = resolve_target(target)
    key = str(t)
    if key not in _TUNING_SCOPES:
        scope = record_scope(t)
        if t.kind.name == "llvm" and datapath_bits(t) < vector_bits(t):
            scope += f"@dp{datapath_bits(t)}"
        _TUNING_SCOPES[key] = scope
    return _TUNING_SCOPES[key]


def preferred_records(records: Sequence, build_target) -> list:
    """Of one workload's ``records`` that apply to ``build_target``, the ones a build uses:
    those timed where the build runs (the same :func:`tuning_scope`) if there are any, else all
    (a Zen 4 takes a Zen 5's records for the kernels it has none of its own for; times measured
    on different CPUs are never compared)."""
    want = tuning_scope(build_target)
    same = [rec for rec in records if tuning_scope(rec.target) == want]
    return same or list(records)


def _read_lines(path: str, strict: bool) -> list[str] | None:
    """The lines of ``path`` (read-only; line ends kept, as text-mode ``readlines`` gives them).

    Lenient: None, with a warning, when the file is missing, unreadable or empty. ``strict``:
    the error is raised.
    """
    if not strict and not os.path.isfile(path):
        _warn(f"tuning log {path}: file not found; using default schedules for its workloads")
        return None
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        if strict:
            raise
        _warn(f"tuning log {path}: cannot be read ({err}); using default schedules")
        return None
    lines = io.StringIO(text, newline=None).readlines()
    if not strict and not any(line.strip() for line in lines):
        _warn(f"tuning log {path}: file is empty; using default schedules for its workloads")
        return None
    return lines


@dataclass
class _ParsedLog:
    """One log directory as :func:`_parse_log` read it.

    ``workloads``: workload line index -> ``ms.database.Workload``. ``records``: one entry per
    line of the record file, in order: ``(line as read, TuningRecord or None, workload index or
    None)``; the record is None for a blank line, a line skipped as corrupt, and a record of a
    workload ``select`` did not choose.
    """

    workloads: dict[int, object]
    records: list[tuple[str, object, object]]


def _parse_log(log_dir: str, strict: bool = False,
               select: Callable[[object], bool] | None = None) -> _ParsedLog | None:
    """Parse the log in ``log_dir``: the one reader of the workload and record files.

    Lenient (reading for a build, :func:`load_logs`): a missing, unreadable or empty file gives a
    :class:`TuningLogWarning` and None; corrupt or truncated lines, and records of a workload
    line that is not there, are skipped with a warning naming them. ``strict`` (rewriting,
    :func:`drop_records`): the first error is raised and a record of a missing workload line is
    kept as it is.

    ``select(workload) -> bool``: only the records of the chosen workloads are parsed into
    ``TuningRecord`` objects (default: all).
    """
    from tvm.s_tir import meta_schedule as ms

    wl_path = os.path.join(log_dir, WORKLOAD_FILE)
    rec_path = os.path.join(log_dir, RECORD_FILE)
    wl_lines = _read_lines(wl_path, strict)
    if wl_lines is None:
        return None
    rec_lines = _read_lines(rec_path, strict)
    if rec_lines is None:
        return None

    workloads: dict[int, object] = {}
    bad_wl = []
    for i, line in enumerate(wl_lines):
        if not line.strip():
            continue
        try:
            workloads[i] = ms.database.Workload.from_json(json.loads(line))
        except Exception:  # json.JSONDecodeError or a TVM parse error
            if strict:
                raise
            bad_wl.append(i + 1)
    if bad_wl:
        _warn(f"tuning log {wl_path}: skipped corrupt or truncated line(s) {_lines(bad_wl)}; "
              f"their workloads use default schedules")
    chosen = workloads if select is None else {i: w for i, w in workloads.items() if select(w)}

    records: list[tuple[str, object, object]] = []
    bad_rec = []
    for i, line in enumerate(rec_lines):
        rec = idx = None
        if line.strip():
            try:
                idx, _rec_json = json.loads(line)
                if idx in chosen:
                    rec = _parse_record(line, chosen[idx])
                elif not strict and idx not in workloads:
                    raise ValueError(f"no workload {idx}")
            except Exception:
                if strict:
                    raise
                bad_rec.append(i + 1)
                rec = idx = None
        records.append((line, rec, idx))
    if bad_rec:
        _warn(f"tuning log {rec_path}: skipped corrupt or truncated line(s) {_lines(bad_rec)}")
    return _ParsedLog(workloads, records)


def _parse_record(line: str, workload):
    """The ``TuningRecord`` of one line of a record file (its trace replayed on ``workload``,
    after registering the tensor intrinsics the trace names)."""
    from tvm.s_tir import meta_schedule as ms

    register_record_intrinsics(line)
    return ms.database.TuningRecord.from_json(json.loads(line)[1], workload)


def _lines(nums: list[int]) -> str:
    shown = ", ".join(map(str, nums[:10]))
    return shown + (f" and {len(nums) - 10} more" if len(nums) > 10 else "")


def run_time(rec) -> float:
    """A record's mean measured seconds (inf when it has none)."""
    secs = [float(s) for s in (rec.run_secs or [])]
    return sum(secs) / len(secs) if secs else float("inf")


_CACHE: dict = {}
_CACHE_SIZE = 4


def _files_state(log_dirs: Sequence[str]) -> tuple:
    """What identifies the logs' contents: path, size and modification time of each file."""
    state = []
    for d in log_dirs:
        for name in (WORKLOAD_FILE, RECORD_FILE):
            try:
                st = os.stat(os.path.join(d, name))
                state.append((d, name, st.st_size, st.st_mtime_ns))
            except OSError:
                state.append((d, name, None, None))
    return tuple(state)


def load_logs(log_dirs: Sequence[str], target) -> LoadedLogs:
    """Read the logs in ``log_dirs`` into one in-memory database, reusing the last reads.

    Parsing the shipped x86 log takes seconds, and a benchmark or a model zoo builds many times
    in one process: a read that raised no warning is kept (keyed by the files' size and
    modification time and by the target), so the next build with the same, unchanged
    logs reuses it. A read that warned is not kept, so every build warns again.

    Parameters
    ----------
    log_dirs : sequence of str
        MetaSchedule JSON database directories. They are only read.
    target : ResolvedTarget, tvm.target.Target, dict or str
        The build target (anything :func:`topi_bn.targets.resolve` takes); records for other
        targets are dropped (see :func:`record_applies`).

    Returns
    -------
    LoadedLogs
    """
    t = resolve(target)
    # the whole target: which records apply also depends on its features (trace_runs_on)
    key = (_files_state(log_dirs), str(t.target), tuning_log_key(t))
    if key in _CACHE:
        return _CACHE[key]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = _read_logs(log_dirs, t)
    for w in caught:  # re-issued to the caller's filters
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if not caught:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = loaded
    return loaded


def _read_logs(log_dirs: Sequence[str], target) -> LoadedLogs:
    """Read the logs in ``log_dirs`` (highest priority first): their workloads, and their
    record lines grouped by workload, to be parsed when a build asks (:class:`LoadedLogs`)."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    out = LoadedLogs(database=ms.database.MemoryDatabase(), sources=list(log_dirs),
                     target=target)
    for log_dir in log_dirs:
        out.counts[log_dir] = {"shadowed": 0, "other_target": 0, "other_pipes": 0, "failed": 0}
        parsed = _parse_log(log_dir, select=lambda _workload: False)
        if parsed is None:
            continue
        grouped: dict[int, list[str]] = {}
        for line, _rec, idx in parsed.records:
            if idx is not None:
                grouped.setdefault(idx, []).append(line)
        for idx, lines in grouped.items():
            workload = parsed.workloads[idx]
            out.pending.setdefault(tvm_ffi.structural_hash(workload.mod), []).append(
                (log_dir, workload, lines))
    return out


def _commit_records(out: LoadedLogs, log_dir: str, workload, lines: list[str]) -> None:
    """Parse one workload's record ``lines`` of ``log_dir`` and commit those that apply to
    ``out.target`` (unless an earlier log committed the workload)."""
    from tvm.s_tir import meta_schedule as ms

    counts = out.counts[log_dir]
    usable, bad = [], 0
    for line in lines:
        try:
            rec = _parse_record(line, workload)
        except Exception:  # noqa: BLE001 -- a trace that does not replay on its workload
            bad += 1
            continue
        if not tuning_record_applies(rec, out.target):
            counts["other_target"] += 1
        elif run_time(rec) >= _FAILED_SECS:
            counts["failed"] += 1
        else:
            usable.append(rec)
    if bad:
        _warn(f"tuning log {os.path.join(log_dir, RECORD_FILE)}: skipped {bad} record(s) whose "
              f"trace does not replay on its workload")
    db = out.database
    if not usable:
        return
    preferred = preferred_records(usable, out.target)
    counts["other_pipes"] += len(usable) - len(preferred)
    usable = preferred
    if db.has_workload(workload.mod):  # an earlier (higher-priority) log has it
        counts["shadowed"] += len(usable)
        return
    committed = db.commit_workload(workload.mod)
    for rec in usable:
        db.commit_tuning_record(ms.database.TuningRecord(
            rec.trace, committed, rec.run_secs, rec.target, rec.args_info))
        out.committed += 1


# -- writing ----------------------------------------------------------------------------------
@contextlib.contextmanager
def log_lock(log_dir: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<log_dir>/.topi_bn.lock`` (blocks until free)."""
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, LOCK_FILE), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_manifest(log_dir: str) -> dict:
    """The resume manifest of ``log_dir`` (``{}`` when there is none or it is unreadable)."""
    path = os.path.join(log_dir, MANIFEST_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def merge_records(log_dir: str, mod, records: Sequence, manifest_key: str | None = None,
                  manifest_entry: dict | None = None) -> int:
    """Append ``records`` to the JSON database in ``log_dir`` as records of workload ``mod``.

    The records keep their trace, run time, target and argument info; their workload becomes
    ``mod`` (the PrimFunc module the build sees: the ``auto`` space tunes a copy without the
    topi-bn rule annotations, whose traces replay unchanged on ``mod``). Under the directory
    lock the files are rewritten through a private copy and ``os.replace``; ``manifest_entry``
    is stored under ``manifest_key`` in the resume manifest at the same time.

    Returns
    -------
    int
        How many records the log holds for ``mod`` afterwards.

    Raises
    ------
    ValueError
        The existing log cannot be parsed; it is left untouched.
    """
    from tvm.s_tir import meta_schedule as ms

    with log_lock(log_dir):
        tmp = tempfile.mkdtemp(prefix=".merge-", dir=log_dir)
        try:
            for name in (WORKLOAD_FILE, RECORD_FILE):
                src = os.path.join(log_dir, name)
                if os.path.exists(src):
                    shutil.copyfile(src, os.path.join(tmp, name))
            try:
                rec_path = os.path.join(tmp, RECORD_FILE)
                if os.path.exists(rec_path):  # the database replays every record's trace
                    with open(rec_path, encoding="utf-8", errors="replace") as f:
                        register_record_intrinsics(f.read())
                jdb = ms.database.JSONDatabase(work_dir=tmp)
            except Exception as err:
                raise ValueError(
                    f"log_dir: the tuning log in {log_dir} cannot be parsed ({err}); it was not "
                    f"changed. Move it away or repair it, then tune again") from None
            workload = jdb.commit_workload(mod)
            for rec in records:
                jdb.commit_tuning_record(ms.database.TuningRecord(
                    rec.trace, workload, rec.run_secs, rec.target, rec.args_info))
            total = len(jdb.get_top_k(workload, 1 << 30))
            del jdb
            if manifest_key is not None:
                manifest = read_manifest(log_dir)
                manifest[manifest_key] = manifest_entry or {}
                with open(os.path.join(tmp, MANIFEST_FILE), "w", encoding="utf-8") as f:
                    json.dump(manifest, f, indent=1, sort_keys=True)
                    f.write("\n")
            # workloads first: a record file never refers to a workload line that is missing
            for name in (WORKLOAD_FILE, RECORD_FILE, MANIFEST_FILE):
                src = os.path.join(tmp, name)
                if os.path.exists(src):
                    with open(src, "rb") as f:
                        os.fsync(f.fileno())
                    os.replace(src, os.path.join(log_dir, name))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return total


def drop_records(log_dir: str, mod, drop: Callable[[object], bool]) -> int:
    """Remove from the log in ``log_dir`` the records of workload ``mod`` for which
    ``drop(record)`` is true (``record``: a ``ms.database.TuningRecord``).

    The other lines stay byte-identical, the workload line included. The files are rewritten
    under the directory lock through a private copy and ``os.replace``, as :func:`merge_records`
    does, so a failure leaves the log as it was.

    Returns
    -------
    int
        How many records were removed.

    Raises
    ------
    ValueError
        The log cannot be parsed; it is left untouched.
    """
    import tvm_ffi

    rec_path = os.path.join(log_dir, RECORD_FILE)
    with log_lock(log_dir):
        try:
            parsed = _parse_log(log_dir, strict=True,
                                select=lambda wl: tvm_ffi.structural_equal(wl.mod, mod))
            kept, dropped = [], 0
            for line, rec, _idx in parsed.records:
                if rec is not None and drop(rec):
                    dropped += 1
                    continue
                kept.append(line)
        except Exception as err:  # noqa: BLE001 -- OSError, JSON or TVM parse errors
            raise ValueError(f"log_dir: the tuning log in {log_dir} cannot be parsed ({err}); "
                             f"it was not changed") from None
        if dropped:
            tmp = tempfile.mkdtemp(prefix=".drop-", dir=log_dir)
            try:
                path = os.path.join(tmp, RECORD_FILE)
                with open(path, "w", encoding="utf-8") as f:
                    f.writelines(kept)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(path, rec_path)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return dropped


def build_visible_mod(func):
    """``func`` as the one-function IRModule MetaSchedule stores and queries (the form a
    record's workload has; every build, tune and verify path makes it here)."""
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod  # TVM's own, not exported

    return _normalize_mod(func)
