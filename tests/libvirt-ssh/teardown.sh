#!/usr/bin/env bash
# teardown.sh [--purge] - undo setup.sh. Stops only processes whose PID setup.sh recorded, after
# checking the PID still names the same program; never by process name.
#   --purge  also removes the test pool, $STATE_DIR and the qemu.conf lines setup added.
# Installed packages and system accounts are left in place.
set -uo pipefail
STATE_DIR=${STATE_DIR:-/tmp/egress-libvirt-ssh}
POOL_NAME=${POOL_NAME:-egress-test}
PURGE=0
[ "${1:-}" = --purge ] && PURGE=1
VIRSH="virsh -q -c qemu:///system"

exited() { [ ! -d "/proc/$1" ] || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; }
# stop PIDFILE NAME: TERM, wait up to 5 s, then KILL; only if the PID is still NAME
stop() {
  local file=$1 name=$2 pid i
  if [ ! -s "$file" ]; then echo "$name: nothing recorded"; return 0; fi
  pid=$(cat "$file")
  if [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
    kill -TERM "$pid"
    for i in $(seq 100); do exited "$pid" && break; sleep 0.05; done
    exited "$pid" || kill -KILL "$pid"
    echo "$name ($pid): stopped"
  else
    echo "$name ($pid): not running"
  fi
  rm -f "$file"
}

ours=0
[ -s "$STATE_DIR/libvirtd.pid" ] && ! exited "$(cat "$STATE_DIR/libvirtd.pid")" && ours=1
if [ "$ours" = 1 ]; then
  # guests were started through our daemon; destroy them rather than orphan their qemu
  for dom in $($VIRSH list --name 2>/dev/null); do $VIRSH destroy "$dom" >/dev/null && echo "destroyed $dom"; done
  if [ "$PURGE" = 1 ] && $VIRSH pool-info "$POOL_NAME" >/dev/null 2>&1; then
    $VIRSH pool-destroy "$POOL_NAME" >/dev/null 2>&1
    $VIRSH pool-undefine "$POOL_NAME" >/dev/null && echo "pool $POOL_NAME undefined"
  fi
fi

stop "$STATE_DIR/fwd.pid" ssh
rm -f "$STATE_DIR/libvirt-fwd.sock"
# connection processes forked by our sshd outlive the listener; stop them by parent PID first
if [ -s "$STATE_DIR/ssh/sshd.pid" ]; then
  for child in $(ps -o pid= --ppid "$(cat "$STATE_DIR/ssh/sshd.pid")" 2>/dev/null); do
    [ "$(cat "/proc/$child/comm" 2>/dev/null)" = sshd ] && kill -TERM "$child" && echo "sshd child $child: stopped"
  done
fi
stop "$STATE_DIR/ssh/sshd.pid" sshd
stop "$STATE_DIR/libvirtd.pid" libvirtd
stop "$STATE_DIR/virtlogd.pid" virtlogd
# The env file describes running daemons; without it the tests skip instead of failing.
rm -f "$STATE_DIR/env"

if [ "$PURGE" = 1 ]; then
  if [ -e "$STATE_DIR/made-qemu.conf" ]; then
    rm -f /etc/libvirt/qemu.conf
  elif grep -q '^# BEGIN egress-libvirt-ssh' /etc/libvirt/qemu.conf 2>/dev/null; then
    sed -i '/^# BEGIN egress-libvirt-ssh/,/^# END egress-libvirt-ssh/d' /etc/libvirt/qemu.conf
  fi
  rm -rf "$STATE_DIR" && echo "removed $STATE_DIR"
fi
