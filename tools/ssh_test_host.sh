#!/usr/bin/env bash
# A second "host" on this machine for multi-box tests: an sshd of its own on a loopback address.
#
#   tools/ssh_test_host.sh start DIR [--address 127.0.0.2] [--port 2222] [--hide PATH]...
#                          [--stop-with PID]
#   tools/ssh_test_host.sh stop DIR
#
# start: installs openssh-server from Debian when sshd is missing; makes in DIR a client key
# (DIR/id_ed25519, authorised for the user running this), a host key and an sshd_config; starts
# sshd on ADDRESS:PORT (log DIR/sshd.log, pid DIR/sshd.pid) and waits until a BatchMode ssh
# with that key runs `true` there. --hide PATH (repeatable) runs that sshd in a mount namespace
# of its own with an empty tmpfs over PATH: a host on which PATH does not exist (a box without
# the project or its venv at the same path). Idempotent: an sshd already running from DIR with
# the same settings is kept; with other settings it is restarted. --stop-with PID: a watcher
# stops that sshd once process PID has ended, however it ended (a test session killed outright
# runs no clean-up, and the daemonized sshd is in no process group of the session's).
# stop: stops the sshd started from DIR (its ssh sessions end with it) and removes nothing.
#
# Connect with: ssh -p PORT -i DIR/id_ed25519 -o BatchMode=yes -o StrictHostKeyChecking=no
#               -o UserKnownHostsFile=/dev/null ADDRESS
# Prints what it did, one line a step; exits non-zero with a line naming the failed step.
set -euo pipefail

say() { echo "[ssh_test_host] $*"; }
die() { echo "[ssh_test_host] error: $*" >&2; exit 1; }

usage() {
  sed -n '4,5p' "$0" | sed 's/^# *//' >&2
  exit 2
}

sshd_pid() {  # the pid of the sshd started from $DIR, if it is alive
  local pid
  pid="$(cat "$DIR/sshd.pid" 2>/dev/null)" || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR/sshd_config" || return 1
  echo "$pid"
}

stop_sshd() {
  local pid deadline
  if ! pid="$(sshd_pid)"; then
    say "no sshd running from $DIR"
    return 0
  fi
  kill "$pid"
  deadline=$((SECONDS + 10))
  while kill -0 "$pid" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || { kill -9 "$pid" 2>/dev/null || true; break; }
    sleep 0.1
  done
  say "stopped sshd (pid $pid) of $DIR"
}

install_sshd() {
  [ -x /usr/sbin/sshd ] && return 0
  [ "$(id -u)" -eq 0 ] || die "sshd is missing; run as root (apt-get install openssh-server)"
  say "installing openssh-server (Debian)"
  # Keep the package's own sshd service (port 22, every address) from starting on install.
  local policy=/usr/sbin/policy-rc.d own_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && own_policy=1
  fi
  timeout 300 apt-get update -qq || { [ "$own_policy" = 1 ] && rm -f "$policy"; die "apt-get update failed"; }
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq openssh-server >/dev/null \
    || { [ "$own_policy" = 1 ] && rm -f "$policy"; die "apt-get install openssh-server failed"; }
  [ "$own_policy" = 1 ] && rm -f "$policy"
  say "installed $(/usr/sbin/sshd -V 2>&1 | head -1 || true)"
}

make_keys() {
  if [ ! -f "$DIR/id_ed25519" ]; then
    ssh-keygen -q -t ed25519 -N '' -C "ssh_test_host client" -f "$DIR/id_ed25519"
    say "made client key $DIR/id_ed25519"
  fi
  if [ ! -f "$DIR/ssh_host_ed25519_key" ]; then
    ssh-keygen -q -t ed25519 -N '' -C "ssh_test_host host" -f "$DIR/ssh_host_ed25519_key"
    say "made host key $DIR/ssh_host_ed25519_key"
  fi
  cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
  chmod 600 "$DIR/authorized_keys" "$DIR/id_ed25519" "$DIR/ssh_host_ed25519_key"
}

write_config() {  # to stdout
  cat <<EOF
# written by tools/ssh_test_host.sh; hide: ${HIDE[*]:-none}
ListenAddress $ADDRESS:$PORT
HostKey $DIR/ssh_host_ed25519_key
PidFile $DIR/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
PermitUserEnvironment no
X11Forwarding no
PrintMotd no
LogLevel VERBOSE
MaxStartups 100:30:200
EOF
}

ssh_check() {
  timeout 10 ssh -p "$PORT" -i "$DIR/id_ed25519" -o BatchMode=yes -o ConnectTimeout=3 \
    -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR \
    "$ADDRESS" true
}

start_sshd() {
  local hide_commands="" path deadline
  for path in "${HIDE[@]}"; do
    hide_commands+="mount -t tmpfs ssh-test-host-hide $(printf '%q' "$path") && "
  done
  if [ -n "$hide_commands" ]; then
    unshare --mount --propagation private sh -c \
      "${hide_commands}exec /usr/sbin/sshd -f '$DIR/sshd_config' -E '$DIR/sshd.log'" \
      || die "could not start sshd in a mount namespace (unshare/mount need root)"
  else
    /usr/sbin/sshd -f "$DIR/sshd_config" -E "$DIR/sshd.log" || die "sshd did not start; see $DIR/sshd.log"
  fi
  deadline=$((SECONDS + 15))
  until ssh_check 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || die "sshd on $ADDRESS:$PORT does not answer; see $DIR/sshd.log"
    sleep 0.2
  done
  say "started sshd (pid $(sshd_pid)) on $ADDRESS:$PORT${HIDE:+ hiding ${HIDE[*]}}, log $DIR/sshd.log"
}

stop_with() {  # a watcher that stops the sshd of $DIR when process $STOP_WITH has ended
  local pid ready="$DIR/watcher.ready" deadline
  [ -n "$STOP_WITH" ] && pid="$(sshd_pid)" || return 0
  rm -f "$ready"
  # A zombie has ended too. The watcher says it is ready once in a session of its own: until
  # then, whoever runs this script and ends its session after (a test's runner) would kill it.
  setsid bash -c 'running() { [ -r "/proc/$1/stat" ] && [ "$(sed "s/.*) //" "/proc/$1/stat" \
                    | cut -d" " -f1)" != Z ]; }
                  touch "$3"
                  while running "$1" && running "$2"; do sleep 1; done
                  kill "$2" 2>/dev/null; exit 0' ssh-test-host-watch "$STOP_WITH" "$pid" \
    "$ready" </dev/null >/dev/null 2>&1 &
  deadline=$((SECONDS + 15))
  until [ -e "$ready" ]; do
    [ "$SECONDS" -lt "$deadline" ] \
      || { stop_sshd >/dev/null; die "the watcher of sshd (pid $pid) did not start"; }
    sleep 0.1
  done
  say "sshd (pid $pid) stops when process $STOP_WITH ends"
}

[ $# -ge 2 ] || usage
ACTION="$1"; DIR="$2"; shift 2
ADDRESS=127.0.0.2; PORT=2222; HIDE=(); STOP_WITH=""
while [ $# -gt 0 ]; do
  case "$1" in
    --address) ADDRESS="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --hide) HIDE+=("$2"); shift 2 ;;
    --stop-with) STOP_WITH="$2"; shift 2 ;;
    *) usage ;;
  esac
done
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"

case "$ACTION" in
  stop) stop_sshd ;;
  start)
    [ -z "$STOP_WITH" ] || kill -0 "$STOP_WITH" 2>/dev/null \
      || die "--stop-with $STOP_WITH: no such process (the sshd would never be stopped)"
    install_sshd
    mkdir -p /run/sshd  # sshd's privilege separation directory
    make_keys
    write_config > "$DIR/sshd_config.new"
    if pid="$(sshd_pid)" && cmp -s "$DIR/sshd_config.new" "$DIR/sshd_config"; then
      rm -f "$DIR/sshd_config.new"
      ssh_check || die "sshd (pid $pid) of $DIR runs but does not let the key in; see $DIR/sshd.log"
      say "sshd (pid $pid) already running on $ADDRESS:$PORT from $DIR"
    else
      stop_sshd >/dev/null
      mv "$DIR/sshd_config.new" "$DIR/sshd_config"
      /usr/sbin/sshd -t -f "$DIR/sshd_config" || die "sshd rejects $DIR/sshd_config"
      say "wrote $DIR/sshd_config"
      start_sshd
    fi
    stop_with
    say "connect: ssh -p $PORT -i $DIR/id_ed25519 -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null $ADDRESS"
    ;;
  *) usage ;;
esac
