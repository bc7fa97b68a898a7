#!/usr/bin/env bash
# Builds the Python Example Cloud provider into a component:
#
#     providers-polyglot/python-examplecloud/build.sh [OUT.wasm]
#
# (default: build/provider_examplecloud_py.wasm beside this script). The toolchain,
# componentize-py as requirements.txt pins it, is installed from PyPI into a virtual environment
# under $EGRESS_POLYGLOT_TOOLS (default: .tools beside this script), once per pin. Needs python3
# with venv and pip (Debian: python3-venv).
#
# Exits 3 when the toolchain cannot be installed (no python3 with venv, PyPI unreachable), so a
# test can tell "cannot build here" from a build that fails.
set -euo pipefail
# The sources are run at build time: no bytecode written into the tree.
export PYTHONDONTWRITEBYTECODE=1
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/build/provider_examplecloud_py.wasm}
tools=${EGRESS_POLYGLOT_TOOLS:-$here/.tools}
python=${PYTHON:-python3}

# One environment per pin: a changed requirements.txt installs afresh beside the old one.
pin=$(sha256sum "$here/requirements.txt" | cut -c1-12)
venv=$tools/componentize-py-$pin
unavailable() {
  echo "build.sh: the toolchain cannot be installed: $1" >&2
  rm -rf "$venv"
  exit 3
}
if [ ! -e "$venv/.installed" ]; then
  rm -rf "$venv"
  mkdir -p "$tools"
  "$python" -m venv "$venv" || unavailable "$python -m venv failed (Debian: apt-get install python3-venv)"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input \
    --require-hashes --only-binary=:all: -r "$here/requirements.txt" ||
    unavailable "pip could not install requirements.txt from PyPI"
  touch "$venv/.installed"
fi

# componentize-py's output differs from build to build for the same inputs (its pre-initialized
# interpreter's heap; upstream issue bytecodealliance/componentize-py#247): a component already
# built from these very inputs is kept, so its digest, and the host's compiled-module cache
# keyed on it, stay put until a source changes.
inputs=$(cd "$here" && cat build.sh requirements.txt ../wit/examplecloud.wit \
  ../../schemas/wit/provider.wit $(find src -name '*.py' | LC_ALL=C sort) | sha256sum | cut -c1-64)
if [ -e "$out" ] && [ "$(cat "$out.inputs" 2>/dev/null)" = "$inputs" ]; then
  echo "$out"
  exit 0
fi

# The world (providers-polyglot/wit) with the contract it names under deps/.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/wit/deps/egress-provider"
cp "$here/../wit/examplecloud.wit" "$work/wit/"
cp "$here/../../schemas/wit/provider.wit" "$work/wit/deps/egress-provider/"

# --stub-wasi: the host grants a provider no file, socket, clock or environment of WASI's (its
# clock and randomness are the contract's `clock`), so the component imports none of WASI and
# each WASI call traps. Python's own random seed is then fixed at build time; this provider
# draws none.
mkdir -p "$(dirname "$out")"
"$venv/bin/componentize-py" --quiet -d "$work/wit" -w examplecloud \
  componentize --stub-wasi -p "$here/src" app -o "$work/out.wasm"
mv "$work/out.wasm" "$out"
echo "$inputs" > "$out.inputs"
echo "$out"
