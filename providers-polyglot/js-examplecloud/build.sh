#!/usr/bin/env bash
# Builds the JavaScript Example Cloud provider into a component:
#
#     providers-polyglot/js-examplecloud/build.sh [OUT.wasm]
#
# (default: build/provider_examplecloud_js.wasm beside this script). The toolchain,
# componentize-js as package.json and package-lock.json pin it (versions and integrity
# digests), is installed from the npm registry with `npm ci` under $EGRESS_POLYGLOT_TOOLS
# (default: .tools beside this script), once per lock. Needs node and npm.
#
# Exits 3 when the toolchain cannot be installed (no node or npm, the registry unreachable), so
# a test can tell "cannot build here" from a build that fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/build/provider_examplecloud_js.wasm}
tools=${EGRESS_POLYGLOT_TOOLS:-$here/.tools}

# One installation per lock: a changed lock installs afresh beside the old one.
pin=$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -c1-12)
prefix=$tools/componentize-js-$pin
unavailable() {
  echo "build.sh: the toolchain cannot be installed: $1" >&2
  rm -rf "$prefix"
  exit 3
}
if [ ! -e "$prefix/.installed" ]; then
  rm -rf "$prefix"
  command -v node >/dev/null || unavailable "node is not installed"
  command -v npm >/dev/null || unavailable "npm is not installed"
  mkdir -p "$prefix"
  cp "$here/package.json" "$here/package-lock.json" "$prefix/"
  (cd "$prefix" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) ||
    unavailable "npm ci could not install package-lock.json from the registry"
  touch "$prefix/.installed"
fi

# componentize-js's output differs from build to build for the same inputs (the engine's heap
# is snapshotted after start-up; upstream issue bytecodealliance/ComponentizeJS#321): a
# component already built from these very inputs is kept, so its digest, and the host's
# compiled-module cache keyed on it, stay put until a source changes.
inputs=$(cd "$here" && cat build.sh package.json package-lock.json ../wit/examplecloud.wit \
  ../../schemas/wit/provider.wit $(find src -name '*.js' | LC_ALL=C sort) | sha256sum | cut -c1-64)
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

# --disable every WASI feature: the host grants a provider no file, socket, clock or
# environment of WASI's (its clock and randomness are the contract's `clock`), so the component
# imports none of WASI.
mkdir -p "$(dirname "$out")"
"$prefix/node_modules/.bin/componentize-js" "$here/src/app.js" \
  --wit "$work/wit" --world-name examplecloud \
  --disable stdio random clocks http fetch-event \
  -o "$work/out.wasm" >&2
mv "$work/out.wasm" "$out"
echo "$inputs" > "$out.inputs"
echo "$out"
