#!/usr/bin/env bash
# Build an aarch64 sysroot for running topi-bn kernels under qemu-user:
#   - host tools: qemu-aarch64 (qemu-user), aarch64-linux-gnu-gcc, the arm64 libc headers
#   - an aarch64 Python 3.11 (Debian bookworm arm64 packages, unpacked with dpkg -x)
#   - the aarch64 apache-tvm wheel in runtime-only mode (compiler library removed) + numpy
#
# Usage: bash scripts/setup_arm_sysroot.sh [SYSROOT]
#   SYSROOT defaults to $TOPI_BN_ARM_SYSROOT, else <repo>/.arm-sysroot.
# Idempotent: exits at once when SYSROOT is complete (stamp file matches this script's pins).
# Needs root (or passwordless sudo) only when apt packages are missing. Debian/Ubuntu only.
# No chroot and no binfmt_misc are needed: programs run as `qemu-aarch64 -L SYSROOT ...`.
set -euo pipefail

TVM_VERSION=0.27.0.post1
TVM_FFI_VERSION=0.1.14.post1    # 0.1.15.* segfaults in tvm.ir.save_json (see notes)
PY_VERSION=3.11
STAMP_CONTENT="topi-bn-arm-sysroot v1 python${PY_VERSION} apache-tvm==${TVM_VERSION} apache-tvm-ffi==${TVM_FFI_VERSION}"

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
R=${1:-${TOPI_BN_ARM_SYSROOT:-$REPO_ROOT/.arm-sysroot}}
R=$(realpath -m "$R")
STAMP="$R/.topi-bn-sysroot"
PY=${PYTHON:-python3}

log() { echo "[setup_arm_sysroot] $*"; }
die() { echo "[setup_arm_sysroot] ERROR: $*" >&2; exit 1; }
trap 'echo "[setup_arm_sysroot] ERROR: command failed (line $LINENO): $BASH_COMMAND" >&2' ERR

host_tools_ok() {
    command -v qemu-aarch64 >/dev/null && command -v aarch64-linux-gnu-gcc >/dev/null \
        && [ -f /usr/aarch64-linux-gnu/include/stdio.h ]
}
sysroot_ok() {
    [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_CONTENT" ] \
        && [ -x "$R/usr/bin/python$PY_VERSION" ] && [ -f "$R/opt/site/tvm/__init__.py" ] \
        && [ -f "$R/opt/site/numpy/__init__.py" ]
}

if host_tools_ok && sysroot_ok; then
    log "sysroot already complete at $R ($STAMP_CONTENT); nothing to do"
    exit 0
fi

START=$(date +%s)
command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian/Ubuntu hosts only"
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; fi
fi
as_root() {
    if [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; then $SUDO "$@"
    else die "need root (or passwordless sudo) to run: $*"; fi
}
export DEBIAN_FRONTEND=noninteractive

# 1. host packages, only those missing
missing=()
for p in qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing host packages: ${missing[*]}"
    as_root apt-get update -q >/dev/null || die "apt-get update failed"
    as_root apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
else
    log "host packages present: qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
fi
host_tools_ok || die "qemu-aarch64 / aarch64-linux-gnu-gcc still missing after apt-get install"

if sysroot_ok; then
    log "sysroot already complete at $R; done"
    exit 0
fi

# 2. arm64 Debian packages of Python 3.11 and its shared libraries, unpacked (no install)
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    log "adding dpkg foreign architecture arm64 and running apt-get update"
    as_root dpkg --add-architecture arm64
    as_root apt-get update -q >/dev/null || die "apt-get update (arm64) failed"
fi
PKGS="python3.11 python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libc6 libgcc-s1
 libstdc++6 gcc-12-base libgomp1 zlib1g libexpat1 libffi8 libssl3 libbz2-1.0 liblzma5 libsqlite3-0
 libncursesw6 libtinfo6 libreadline8 libuuid1 libdb5.3 libcrypt1 libnsl2 libtirpc3 libgssapi-krb5-2
 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2"
# Build in place; the stamp is written last, so an interrupted build is never taken as complete.
if [ -e "$R" ] && [ -n "$(ls -A "$R")" ]; then
    [ -e "$R/usr/bin/python$PY_VERSION" ] || [ -e "$R/opt/site" ] \
        || die "$R exists, is not empty and does not look like a sysroot made by this script; remove it or pass another path"
    log "removing incomplete or outdated sysroot at $R"
    rm -rf "$R"
fi
WORK="$R"
mkdir -p "$WORK"
DEBS=$(mktemp -d); chmod 755 "$DEBS"   # apt-get download runs as _apt, which must see the folder
trap 'rm -rf "$DEBS"' EXIT
log "downloading arm64 packages into $DEBS"
( cd "$DEBS" && apt-get download -q $(for p in $PKGS; do echo "$p:arm64"; done) media-types >/dev/null ) \
    || die "apt-get download of arm64 packages failed (is there an arm64 entry in the apt sources? try apt-get update)"
log "unpacking $(ls "$DEBS"/*.deb | wc -l) packages into $WORK"
for f in "$DEBS"/*.deb; do dpkg -x "$f" "$WORK"; done
[ -x "$WORK/usr/bin/python$PY_VERSION" ] || die "aarch64 python$PY_VERSION not found after unpacking"

# .pyc files written by any host CPython 3.11 are valid for the aarch64 one (same magic number);
# precompiling halves the start-up time under emulation.
HOST311=$(command -v python3.11 || true)
if [ -n "$HOST311" ]; then
    log "precompiling the aarch64 stdlib with $HOST311"
    "$HOST311" -m compileall -q -j2 "$WORK/usr/lib/python$PY_VERSION" >/dev/null 2>&1 || true
fi

# 3. the aarch64 wheels (pip resolves them for the target platform; nothing is executed)
log "pip: apache-tvm==$TVM_VERSION apache-tvm-ffi==$TVM_FFI_VERSION numpy (manylinux_2_28_aarch64, cp311) into $WORK/opt/site"
"$PY" -m pip install -q --disable-pip-version-check --no-warn-script-location --target "$WORK/opt/site" \
    --platform manylinux_2_28_aarch64 --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    "apache-tvm==$TVM_VERSION" "apache-tvm-ffi==$TVM_FFI_VERSION" numpy 2> >(grep -v '^WARNING' >&2) \
    || die "pip download of the aarch64 wheels failed"
# Runtime-only: drop the ~240 MB compiler library and the CUDA runtime; `import tvm` then falls
# back to runtime-only mode by itself (keep libtvm_ffi_testing.so, tvm_ffi needs it).
rm -f "$WORK/opt/site/tvm/lib/libtvm_compiler.so" "$WORK/opt/site/tvm/lib/libtvm_runtime_cuda.so"

# 4. smoke test under qemu, then write the stamp
log "smoke test: import tvm, numpy under qemu-aarch64"
out=$(qemu-aarch64 -L "$WORK" -E PYTHONPATH="$WORK/opt/site" "$WORK/usr/bin/python$PY_VERSION" -c \
      "import platform, numpy, tvm; print(platform.machine(), tvm.__version__, numpy.__version__)" 2>&1) \
    || die "the aarch64 python could not import tvm under qemu-aarch64: $out"
log "  -> $out"
echo "$STAMP_CONTENT" > "$STAMP"
log "done in $(( $(date +%s) - START )) s: $R ($(du -sh "$R" | cut -f1))"
