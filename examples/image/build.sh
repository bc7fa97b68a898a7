#!/usr/bin/env bash
# Builds the egress-proxies image without a container engine, and checks it.
#
#   examples/image/build.sh [--binary PATH] [--archive PATH]
#
# 1. builds the static (musl) release binary: one `cargo build --release` (skipped with
#    --binary, which must be such a binary),
# 2. assembles an OCI image from scratch with buildah (vfs storage, no registry, no RUN step,
#    so no container runtime): the binary, the CA certificates, the cache directory, a non-root
#    user; tags it ghcr.io/egress-proxies/egress-proxies:<workspace version> and writes it as
#    an OCI archive (default target/image/egress-proxies-<version>.oci.tar),
# 3. checks it: the image config (user, entrypoint, environment), the exact file list of its
#    root filesystem (nothing else: no shell), and the binary run from that root filesystem the
#    way a Pod of examples/deploy runs it (as the image's user, only the image's environment,
#    the root read-only, a tmpfs on the cache directory): --version, the embedded dry-run plan
#    (which must equal the plan snapshot the tests hold, twice, the second from the module
#    cache), and HTTPS to a local receiver: trusted with its CA at the image's CA bundle path,
#    refused with the image's own bundle; then the plan again in an OCI runtime (runc, through
#    `buildah run`), which runs it as the image's user.
#
# Needs root (CI runs it as root): buildah's vfs storage and the check's private mount
# namespace and chroot. Debian packages: buildah, runc, musl-tools (cc-rs compiles the C parts of ring
# and zstd for the musl target with its musl-gcc, and fails without one), ca-certificates,
# openssl.
# The Containerfile at the top of the repository builds the same image with podman or docker.
set -euo pipefail

repository=ghcr.io/egress-proxies/egress-proxies
target=x86_64-unknown-linux-musl
uid=65532
bin_path=/usr/local/bin/egress-proxies
cache_path=/var/cache/egress-proxies
ca_path=/etc/ssl/certs/ca-certificates.crt
host_ca=${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
buildah=(buildah --storage-driver "${STORAGE_DRIVER:-vfs}")
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
repo_root=$(cd "$(dirname "$0")/../.." && pwd)

fail() {
  echo "error: $*" >&2
  exit 1
}

ms_since() { # START (an $EPOCHREALTIME): the milliseconds since
  local now=$EPOCHREALTIME
  echo $(((${now/./} - ${1/./}) / 1000))
}

# Runs the image's binary from its root filesystem ROOT as a Pod would: the image's user, only
# the image's environment (IMAGE_ENV), the root read-only, the cache directory an empty tmpfs.
# Step 3 runs it in a private mount namespace, as `build.sh --in-image ROOT`.
in_image() {
  local root=$1
  mount --bind "$root" "$root"
  mount -o remount,bind,ro "$root"
  mount -t tmpfs -o "mode=0755,uid=$uid,gid=$uid,size=256m" tmpfs "$root$cache_path"
  local -a env
  mapfile -t env <<<"$IMAGE_ENV"
  # What a runtime adds to an image that sets neither (as podman and containerd do).
  env+=(HOME=/ PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
  # run [NAME=VALUE...] [ARG...]: the entrypoint with ARGs, the image's environment plus NAMEs.
  run() {
    local -a extra=()
    while [ $# -gt 0 ] && [[ $1 == *=* ]]; do extra+=("$1"); shift; done
    env -i "${env[@]}" "${extra[@]}" chroot --userspec="$uid:$uid" "$root" "$bin_path" "$@"
  }

  if touch "$root/probe" 2>/dev/null; then fail "the root filesystem is writable"; fi

  local v
  v=$(run --version)
  [ "$v" = "egress-proxies $VERSION" ] || fail "--version printed '$v', not 'egress-proxies $VERSION'"
  echo "ok: --version: $v"

  local expected=$WORK/plan.expected start=$EPOCHREALTIME
  run >"$WORK/plan.1" 2>"$WORK/plan.1.err" || { cat "$WORK/plan.1.err" >&2; fail "the plan failed"; }
  local cold warm
  cold=$(ms_since "$start")
  diff -u "$expected" "$WORK/plan.1" >&2 || fail "the image's plan differs from the snapshot"
  [ -n "$(find "$root$cache_path" -type f)" ] || fail "no compiled module was cached in $cache_path"
  start=$EPOCHREALTIME
  run >"$WORK/plan.2" 2>"$WORK/plan.2.err" || { cat "$WORK/plan.2.err" >&2; fail "the second plan failed"; }
  warm=$(ms_since "$start")
  cmp -s "$WORK/plan.1" "$WORK/plan.2" || fail "the plan from the module cache differs"
  if [ -s "$WORK/plan.1.err" ] || [ -s "$WORK/plan.2.err" ]; then
    cat "$WORK/plan.1.err" "$WORK/plan.2.err" >&2
    fail "the plan wrote to stderr"
  fi
  echo "ok: the plan equals the snapshot ($(wc -l <"$WORK/plan.1") lines; ${cold} ms, then ${warm} ms from the module cache in $cache_path)"

  # TLS roots: the binary must trust what the image holds at $ca_path. A local receiver's
  # certificate is signed by a throwaway CA; with that CA in place of the bundle the traces of a
  # plan reach it over HTTPS, and with the image's own bundle the handshake is refused.
  local tls=$WORK/tls
  mkdir -p "$tls"
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=check-ca \
    -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 \
    -keyout "$tls/srv.key" -out "$tls/srv.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' \
    >"$tls/ext"
  openssl x509 -req -in "$tls/srv.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial \
    -days 1 -extfile "$tls/ext" -out "$tls/srv.pem" 2>/dev/null
  # s_server prints what a client sends once the handshake is done, and stops at the end of its
  # input: it reads an open FIFO that nothing writes to.
  mkfifo "$tls/stdin"
  local quiet
  exec {quiet}<>"$tls/stdin"
  traces_over_https() { # LOG: one plan's traces to a local receiver; 0 when they arrived
    local log=$1 port=$((20000 + RANDOM % 20000)) pid
    openssl s_server -accept "127.0.0.1:$port" -cert "$tls/srv.pem" -key "$tls/srv.key" \
      <&"$quiet" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 50); do grep -q ACCEPT "$log" && break; sleep 0.1; done
    run OTEL_EXPORTER_OTLP_ENDPOINT="https://127.0.0.1:$port" OTEL_EXPORTER_OTLP_TIMEOUT=2000 \
      >/dev/null 2>"$log.client" || true
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    grep -q 'POST /v1/traces' "$log"
  }
  mount --bind "$tls/ca.pem" "$root$ca_path"
  traces_over_https "$tls/trusted.log" ||
    { cat "$tls/trusted.log" "$tls/trusted.log.client" >&2; fail "no HTTPS request with the CA at $ca_path"; }
  umount "$root$ca_path"
  if traces_over_https "$tls/untrusted.log"; then
    fail "HTTPS to a certificate the image's CA bundle does not hold succeeded"
  fi
  grep -q 'alert unknown ca' "$tls/untrusted.log" ||
    { cat "$tls/untrusted.log" "$tls/untrusted.log.client" >&2; fail "the handshake did not fail on the certificate"; }
  echo "ok: HTTPS trusts the CA bundle at $ca_path and refuses a CA it does not hold (OTLP export to a local receiver)"
}

if [ "${1:-}" = --in-image ]; then
  cd "$repo_root"
  in_image "$2"
  exit 0
fi

binary=
archive=
while [ $# -gt 0 ]; do
  case $1 in
    --binary) binary=$2; shift 2 ;;
    --archive) archive=$2; shift 2 ;;
    *) fail "unknown argument $1 (usage: $0 [--binary PATH] [--archive PATH])" ;;
  esac
done
[ "$(id -u)" = 0 ] || fail "run as root: buildah's vfs storage and the check's mounts need it"
for tool in buildah openssl readelf chroot unshare; do
  command -v "$tool" >/dev/null || fail "$tool not found (Debian: apt-get install buildah openssl binutils)"
done
[ -s "$host_ca" ] || fail "no CA bundle at $host_ca (Debian: apt-get install ca-certificates)"
here=$(pwd)
cd "$repo_root"

version=$(cargo pkgid -p egress-proxies)
version=${version##*@}
image=$repository:$version
target_dir=${CARGO_TARGET_DIR:-target}
out=$target_dir/image
mkdir -p "$out"
if [ -z "$archive" ]; then
  archive=$out/egress-proxies-$version.oci.tar
else
  case $archive in /*) ;; *) archive=$here/$archive ;; esac
fi
WORK=$(mktemp -d)
ctr=
check_ctr=
cleanup() {
  [ -z "$check_ctr" ] || "${buildah[@]}" rm "$check_ctr" >/dev/null 2>&1 || true
  [ -z "$ctr" ] || "${buildah[@]}" rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== 1. the static binary ($target, release)"
start=$SECONDS
if [ -z "$binary" ]; then
  if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target"
  fi
  # Without the default `unify-with-tests`: the image carries none of the test build's features
  # (tokio's paused clock among them; host/workspace-hack says why the dev build has them).
  cargo build --release --locked -p egress-proxies --no-default-features --target "$target"
  binary=$target_dir/$target/release/egress-proxies
else
  case $binary in /*) ;; *) binary=$here/$binary ;; esac
fi
[ -x "$binary" ] || fail "no binary at $binary"
if readelf -lW "$binary" | grep -q 'program interpreter'; then
  fail "$binary is dynamically linked (it names a program interpreter)"
fi
if readelf -dW "$binary" | grep -q NEEDED; then fail "$binary needs shared libraries"; fi
echo "   $binary: static, $(du -h "$binary" | cut -f1) ($((SECONDS - start))s)"

echo "== 2. the image $image (buildah, from scratch)"
start=$SECONDS
empty=$WORK/empty
mkdir "$empty"
"${buildah[@]}" rmi "$image" >/dev/null 2>&1 || true
ctr=$("${buildah[@]}" from scratch)
"${buildah[@]}" copy --quiet --chmod 0755 "$ctr" "$binary" "$bin_path"
"${buildah[@]}" copy --quiet --chmod 0644 "$ctr" "$host_ca" "$ca_path"
"${buildah[@]}" copy --quiet "$ctr" "$empty" "${cache_path%/*}"
"${buildah[@]}" copy --quiet --chown "$uid:$uid" "$ctr" "$empty" "$cache_path"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
"${buildah[@]}" config \
  --os linux --arch amd64 \
  --user "$uid:$uid" \
  --entrypoint "[\"$bin_path\"]" \
  --env "EGRESS_PROXIES_CACHE_DIR=$cache_path" \
  --workingdir / \
  --port 8080/tcp \
  --label org.opencontainers.image.title=egress-proxies \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  "$ctr"
# The commit's time, so a rebuild of the same commit and binary is the same image.
created=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
"${buildah[@]}" commit --quiet --format oci --timestamp "$created" --rm "$ctr" "$image" >/dev/null
ctr=
rm -f "$archive"
"${buildah[@]}" push --quiet "$image" "oci-archive:$archive:$image"
echo "   $image: $("${buildah[@]}" images --format '{{.ID}} {{.Size}}' "$image")," \
  "archive $archive $(du -h "$archive" | cut -f1) ($((SECONDS - start))s)"

echo "== 3. the check"
start=$SECONDS
field() { "${buildah[@]}" inspect --type image --format "$1" "$image"; }
[ "$(field '{{.OCIv1.Config.User}}')" = "$uid:$uid" ] || fail "the image's user is not $uid:$uid"
[ "$(field '{{.OCIv1.Config.Entrypoint}}')" = "[$bin_path]" ] ||
  fail "the image's entrypoint is $(field '{{.OCIv1.Config.Entrypoint}}'), not [$bin_path]"
IMAGE_ENV=$(field '{{range .OCIv1.Config.Env}}{{.}}{{"\n"}}{{end}}' | sed '/^$/d')
[ "$IMAGE_ENV" = "EGRESS_PROXIES_CACHE_DIR=$cache_path" ] ||
  fail "the image's environment is '$IMAGE_ENV', not EGRESS_PROXIES_CACHE_DIR=$cache_path"
echo "ok: config: user $uid:$uid, entrypoint [$bin_path], env $IMAGE_ENV"

check_ctr=$("${buildah[@]}" from --pull-never "$image")
root=$("${buildah[@]}" mount "$check_ctr")
expected_files="\
d 0:0 .
d 0:0 ./etc
d 0:0 ./etc/ssl
d 0:0 ./etc/ssl/certs
f 0:0 644 .$ca_path
d 0:0 ./usr
d 0:0 ./usr/local
d 0:0 ./usr/local/bin
f 0:0 755 .$bin_path
d 0:0 ./var
d 0:0 ./var/cache
d $uid:$uid .$cache_path"
files=$(cd "$root" && find . -printf '%y %U:%G %m %p\n' | sort -k4 |
  awk '$1 == "d" { print $1, $2, $4; next } { print }')
if [ "$files" != "$expected_files" ]; then
  diff -u <(echo "$expected_files") <(echo "$files") >&2 || true
  fail "the image's root filesystem holds other files than the binary, the CA bundle and the cache directory"
fi
cmp -s "$root$bin_path" "$binary" || fail "the image's binary is not $binary"
certs=$(grep -c 'BEGIN CERTIFICATE' "$root$ca_path")
[ "$certs" -gt 50 ] || fail "the CA bundle holds $certs certificates"
echo "ok: root filesystem: exactly the binary, $ca_path ($certs certificates) and $cache_path (uid $uid); no shell"

# The plan of the embedded examples, as `cargo run -p egress-proxies` prints it; the snapshot
# test holds the same text (after its header).
expected=$WORK/plan.expected
awk 'n >= 2 { print } /^---$/ { n++ }' tests/tests/snapshots/plans__plan_default_text.snap \
  >"$expected"
export WORK VERSION=$version IMAGE_ENV
unshare --mount --propagation private -- "$self" --in-image "$root"

# In an OCI runtime: runc through `buildah run`, with the image's user and environment and no
# capabilities. Here the cache is the image's own directory, as in a `podman run` without a
# volume, so its files show whom the runtime ran the binary as. (crun, buildah's default, does
# not start on a host whose cgroups are mixed v1 and v2.)
if command -v runc >/dev/null; then
  "${buildah[@]}" run --runtime "$(command -v runc)" --isolation oci --cap-drop all \
    "$check_ctr" -- "$bin_path" >"$WORK/plan.oci" 2>"$WORK/plan.oci.err" ||
    { cat "$WORK/plan.oci.err" >&2; fail "the plan failed under runc"; }
  diff -u "$expected" "$WORK/plan.oci" >&2 || fail "the plan under runc differs from the snapshot"
  owners=$(find "$root$cache_path" -type f -printf '%U:%G\n' | sort -u)
  [ "$owners" = "$uid:$uid" ] ||
    fail "the module cache files under runc are owned by '${owners//$'\n'/ }', not $uid:$uid"
  echo "ok: under runc (buildah run): the plan equals the snapshot; the cache it wrote is $uid:$uid's"
elif [ "${EGRESS_REQUIRE_REAL_BACKENDS:-}" = 1 ]; then
  fail "runc not found (Debian: apt-get install runc)"
else
  echo "skipped: the run under an OCI runtime: runc not found (Debian: apt-get install runc)"
fi
echo "   ($((SECONDS - start))s)"
echo "== built and checked $image ($archive)"
