#!/usr/bin/env bash
# setup.sh - bring up a real libvirtd (QEMU/TCG) reachable only through a real sshd on loopback,
# for the libvirt-rpc integration tests and benchmarks. Safe to run again: every step checks
# whether its work is already done. Run as root.
#
#   sudo tests/libvirt-ssh/setup.sh
#   . /tmp/egress-libvirt-ssh/env          # LIBVIRT_SSH_* paths for tests and benches
#   sudo tests/libvirt-ssh/teardown.sh [--purge]
#
# Knobs (environment, all optional):
#   STATE_DIR=/tmp/egress-libvirt-ssh   keys, configs, pid files, logs, the env file
#   SSH_PORT=2222                       sshd listens on 127.0.0.1 only
#   POOL_NAME=egress-test               directory storage pool under $STATE_DIR/pool
#   START_FORWARD=1                     keep an `ssh -N -L` forward of the libvirt socket (benches)
#   SKIP_INSTALL=1                      never call apt-get
#
# Network: nothing here talks to anything but loopback once packages are present. libvirt's
# default NAT network is never started; test domains have no NIC, or one on a bridge the test
# creates without an address and with the NIC option ROM off, so no frame leaves the host.
set -euo pipefail

STATE_DIR=${STATE_DIR:-/tmp/egress-libvirt-ssh}
SSH_PORT=${SSH_PORT:-2222}
POOL_NAME=${POOL_NAME:-egress-test}
POOL_DIR=${POOL_DIR:-$STATE_DIR/pool}
START_FORWARD=${START_FORWARD:-1}
SKIP_INSTALL=${SKIP_INSTALL:-0}
LIBVIRT_SOCK=/var/run/libvirt/libvirt-sock
URI=qemu:///system
export DEBIAN_FRONTEND=noninteractive LC_ALL=C

if [ "$(id -u)" != 0 ]; then echo "setup.sh: run as root" >&2; exit 1; fi
mkdir -p "$STATE_DIR/ssh" "$STATE_DIR/logs"
chmod 700 "$STATE_DIR" "$STATE_DIR/ssh"

step() { echo "-- $*"; }
# running PIDFILE NAME: the recorded process exists, is not a zombie, and is NAME
running() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  [ -d "/proc/$pid" ] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}
# retry SECONDS CMD...: poll every 100 ms until CMD succeeds
retry() {
  local left=$(( $1 * 10 )); shift
  until "$@" >/dev/null 2>&1; do
    left=$(( left - 1 )); [ "$left" -gt 0 ] || return 1; sleep 0.1
  done
}

# -- 1. packages. The image carries qemu-utils from bookworm-backports, which conflicts with
# bookworm's qemu-system 7.2, so libvirt and qemu come from backports through a private apt
# configuration (the system's sources are left untouched).
step packages
# ovmf: UEFI domains (firmware='efi' autoselection reads its descriptors); genisoimage: isoinfo,
# which the end-to-end test uses to read back the seed ISO's Joliet tree.
PACKAGES="openssh-server openssh-client qemu-utils qemu-system-x86 libvirt-daemon
  libvirt-daemon-driver-qemu libvirt-daemon-driver-storage libvirt-clients curl ovmf genisoimage"
missing=0
for p in $PACKAGES; do
  st=$(dpkg-query -W -f='${db:Status-Abbrev}${Version}' "$p" 2>/dev/null) || { missing=1; break; }
  case "$st" in ii*) ;; *) missing=1; break;; esac
  case "$p" in libvirt*|qemu*) [[ $st == *bpo12* ]] || { missing=1; break; };; esac
done
if [ "$missing" = 1 ] && [ "$SKIP_INSTALL" != 1 ]; then
  APT="$STATE_DIR/apt"
  mkdir -p "$APT/lists/partial" "$APT/archives/partial"
  KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
  MIRROR=$(awk '/^URIs:/{print $2}' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v -- -security | head -1 || true)
  [ -n "$MIRROR" ] || MIRROR=$(awk '$1=="deb"{print $2}' /etc/apt/sources.list 2>/dev/null | grep -v -- -security | head -1 || true)
  [ -n "$MIRROR" ] || { echo "setup.sh: no Debian mirror configured" >&2; exit 1; }
  for suite in bookworm bookworm-updates bookworm-backports; do
    echo "deb [signed-by=$KEYRING] $MIRROR $suite main"
  done > "$APT/sources.list"
  printf 'Package: src:libvirt src:qemu src:seabios\nPin: release n=bookworm-backports\nPin-Priority: 990\n' > "$APT/preferences"
  APT_OPTS=(-o APT::Sandbox::User=root -o "Dir::Etc::sourcelist=$APT/sources.list"
    -o Dir::Etc::sourceparts=- -o "Dir::Etc::preferences=$APT/preferences"
    -o "Dir::State::lists=$APT/lists" -o "Dir::Cache::archives=$APT/archives")
  apt-get "${APT_OPTS[@]}" update -qq
  # shellcheck disable=SC2086
  apt-get "${APT_OPTS[@]}" install -y -qq --no-install-recommends $PACKAGES
fi

# -- 2. what libvirt-daemon-system would have made (it is not installed: it pulls polkit)
step accounts
getent group kvm >/dev/null || addgroup --quiet --system kvm
getent group libvirt >/dev/null || addgroup --quiet --system libvirt
# the qemu driver refuses to load when its built-in user is missing, even if qemu.conf overrides it
getent passwd libvirt-qemu >/dev/null || adduser --quiet --system --ingroup kvm --disabled-login \
  --disabled-password --home /var/lib/libvirt --no-create-home libvirt-qemu
mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/images /var/lib/libvirt/qemu/nvram /var/cache/libvirt /run/sshd
chmod 755 /run/sshd
# Guests run as root: otherwise libvirt judges /dev/kvm unusable, drops its capability cache on
# every lookup and re-probes qemu, which makes each define take tens of seconds.
[ -e /etc/libvirt/qemu.conf ] || { touch /etc/libvirt/qemu.conf; touch "$STATE_DIR/made-qemu.conf"; }
if ! grep -qE '^[[:space:]]*user[[:space:]]*=' /etc/libvirt/qemu.conf; then
  printf '# BEGIN egress-libvirt-ssh\nuser = "root"\ngroup = "root"\n# END egress-libvirt-ssh\n' >> /etc/libvirt/qemu.conf
fi

# -- 3. daemons: virtlogd must be up before any domain starts
step daemons
if ! running "$STATE_DIR/virtlogd.pid" virtlogd; then
  if [ -S /run/libvirt/virtlogd-sock ] && [ ! -s "$STATE_DIR/virtlogd.pid" ]; then
    echo "   a virtlogd not started here is present; using it"
  else
    virtlogd -d --pid-file "$STATE_DIR/virtlogd.pid"
  fi
fi
if ! running "$STATE_DIR/libvirtd.pid" libvirtd; then
  if virsh -c "$URI" version >/dev/null 2>&1; then
    echo "   a libvirtd not started here answers on $LIBVIRT_SOCK; using it"
  else
    libvirtd -d --pid-file "$STATE_DIR/libvirtd.pid"
  fi
fi
retry 120 virsh -c "$URI" version || { echo "setup.sh: libvirtd did not answer" >&2; exit 1; }

# -- 4. a directory storage pool
step "pool $POOL_NAME"
mkdir -p "$POOL_DIR"
if ! virsh -c "$URI" pool-info "$POOL_NAME" >/dev/null 2>&1; then
  virsh -q -c "$URI" pool-define-as "$POOL_NAME" dir --target "$POOL_DIR"
  virsh -q -c "$URI" pool-build "$POOL_NAME"
fi
if [ "$(virsh -c "$URI" pool-info "$POOL_NAME" | awk '/^State:/{print $2}')" != running ]; then
  virsh -q -c "$URI" pool-start "$POOL_NAME"
fi

# -- 5. sshd on loopback with its own keys; plus a second, unauthorised client key and a
# known_hosts naming a different host key, for the fault tests
step "sshd 127.0.0.1:$SSH_PORT"
S="$STATE_DIR/ssh"
[ -f "$S/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$S/host_ed25519"
[ -f "$S/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C egress-libvirt-test -f "$S/id_ed25519"
[ -f "$S/stranger_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C egress-libvirt-stranger -f "$S/stranger_ed25519"
[ -f "$S/other_host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$S/other_host_ed25519"
install -m 600 "$S/id_ed25519.pub" "$S/authorized_keys"
cat > "$S/sshd_config" <<CONF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $S/host_ed25519
PidFile $S/sshd.pid
AuthorizedKeysFile $S/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
StreamLocalBindUnlink yes
X11Forwarding no
MaxSessions 64
MaxStartups 64:30:128
LogLevel VERBOSE
CONF
if ! running "$S/sshd.pid" sshd; then
  /usr/sbin/sshd -t -f "$S/sshd_config"
  /usr/sbin/sshd -f "$S/sshd_config" -E "$STATE_DIR/logs/sshd.log"
fi
retry 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$SSH_PORT" || { echo "setup.sh: sshd is not listening" >&2; exit 1; }
# OpenSSH writes non-22 ports as [host]:port; the client must match that form
echo "[127.0.0.1]:$SSH_PORT $(cut -d' ' -f1,2 "$S/host_ed25519.pub")" > "$S/known_hosts"
echo "[127.0.0.1]:$SSH_PORT $(cut -d' ' -f1,2 "$S/other_host_ed25519.pub")" > "$S/wrong_known_hosts"
printf '#!/bin/sh\nexec ssh -o IdentitiesOnly=yes -o BatchMode=yes -o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes "$@"\n' \
  "$S/known_hosts" > "$S/ssh"
chmod 755 "$S/ssh"

# -- 6. optional local forward of the libvirt socket: each connection to it becomes one
# direct-streamlocal channel (what virsh uses in the benchmark, like-for-like with our client)
FWD="$STATE_DIR/libvirt-fwd.sock"
if [ "$START_FORWARD" = 1 ] && ! running "$STATE_DIR/fwd.pid" ssh; then
  rm -f "$FWD"
  "$S/ssh" -p "$SSH_PORT" -i "$S/id_ed25519" -N -o ExitOnForwardFailure=yes -o ServerAliveInterval=15 \
    -L "$FWD:$LIBVIRT_SOCK" root@127.0.0.1 </dev/null >>"$STATE_DIR/logs/fwd.log" 2>&1 &
  echo $! > "$STATE_DIR/fwd.pid"
  retry 10 test -S "$FWD" || { echo "setup.sh: ssh -L forward failed" >&2; cat "$STATE_DIR/logs/fwd.log" >&2; exit 1; }
fi

# KEY='value' lines: sourceable by a shell, and parsed by the tests
cat > "$STATE_DIR/env" <<ENV
export LIBVIRT_SSH_HOST='127.0.0.1'
export LIBVIRT_SSH_PORT='$SSH_PORT'
export LIBVIRT_SSH_USER='root'
export LIBVIRT_SSH_KEY='$S/id_ed25519'
export LIBVIRT_SSH_KNOWN_HOSTS='$S/known_hosts'
export LIBVIRT_SSH_WRONG_KEY='$S/stranger_ed25519'
export LIBVIRT_SSH_WRONG_KNOWN_HOSTS='$S/wrong_known_hosts'
export LIBVIRT_SSH_SSHD_PID_FILE='$S/sshd.pid'
export LIBVIRT_SOCKET='$LIBVIRT_SOCK'
export LIBVIRT_POOL='$POOL_NAME'
export LIBVIRT_POOL_DIR='$POOL_DIR'
export LIBVIRT_FWD_SOCKET='$FWD'
export LIBVIRT_FWD_URI='qemu+unix:///system?socket=$FWD'
export LIBVIRT_SSH_URI='qemu+ssh://root@127.0.0.1:$SSH_PORT/system?keyfile=$S/id_ed25519&command=$S/ssh'
ENV

# -- 7. one real round trip through ssh proves the chain
step check
timeout 30 virsh -c "qemu+ssh://root@127.0.0.1:$SSH_PORT/system?keyfile=$S/id_ed25519&command=$S/ssh" hostname >/dev/null
if [ "$START_FORWARD" = 1 ]; then timeout 30 virsh -c "qemu+unix:///system?socket=$FWD" hostname >/dev/null; fi
echo "ready: $STATE_DIR/env"
