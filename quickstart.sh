#!/usr/bin/env bash
# From a fresh clone to a running sandbox-host (Klavis's Local Sandbox REST
# API), in one command:
#
#   ./quickstart.sh [--listen HOST:PORT] [--data-dir DIR] [--pool-size N]
#                   [--servers "NAME ..." | --all-servers] [--no-install]
#   ./quickstart.sh --stop [--data-dir DIR]
#
# 1. installs what is missing (each only when missing): the Debian packages
#    the build, the servers and the isolated process backend need
#    (bubblewrap, uidmap, passt, iproute2), a subordinate id range in
#    /etc/subuid and /etc/subgid, Rust (rustup) when there is no cargo, and
#    the MCP servers as packaging/locks/ pins them
#    (packaging/install-servers.sh; by default filesystem, git, terminal,
#    localmemory and excel, with the rest of the npm servers' lock), their
#    virtualenvs on the system's /usr/bin/python3;
# 2. builds sandbox-host, sandbox-agent and sandboxctl (cargo build --release);
# 3. writes a random API key to DIR/api-key (mode 0600) and starts
#    sandbox-host in the background on the process backend with
#    packaging/servers.toml, logging to DIR/host.log;
# 4. waits until it answers, then prints the base URL, the key and a first
#    curl.
#
# Defaults: --listen 127.0.0.1:8080, --data-dir /var/lib/sandbox-host,
# --pool-size 1. The host runs as root (it maps the sandboxes' user ids and
# makes their cgroups): run this as root, or as a user with sudo. --stop
# releases the host's sandboxes, stops it and whatever of it is left.
set -euo pipefail
cd "$(dirname "$0")"
repo=$PWD

listen=127.0.0.1:8080
data=/var/lib/sandbox-host
pool=1
servers="filesystem git terminal localmemory excel"
install=1
stop=0
usage() { sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case $1 in
  --listen) listen=$2; shift 2 ;;
  --data-dir) data=$2; shift 2 ;;
  --pool-size) pool=$2; shift 2 ;;
  --servers) servers=$2; shift 2 ;;
  --all-servers) servers=""; shift ;;
  --no-install) install=0; shift ;;
  --stop) stop=1; shift ;;
  -h | --help) usage ;;
  *) echo "quickstart: unknown argument $1" >&2; usage 2 >&2 ;;
  esac
done
say() { if [ -t 1 ]; then printf '\033[1mquickstart:\033[0m %s\n' "$*"; else echo "quickstart: $*"; fi; }
die() { echo "quickstart: $*" >&2; exit 1; }

# Root does everything itself; anyone else through sudo, when it exists.
SUDO=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || die "the host must run as root: run this as root (no sudo here)"
  SUDO=(sudo)
fi
mkdir_data() { "${SUDO[@]}" mkdir -p "$data" && "${SUDO[@]}" chmod 0755 "$data"; }
data=$(realpath -m "$data")

if [ "$stop" = 1 ]; then
  pid=$("${SUDO[@]}" cat "$data/host.pid" 2>/dev/null) || die "no host.pid in $data: nothing to stop"
  if "${SUDO[@]}" kill -0 "$pid" 2>/dev/null; then
    # Release what is leased (leased sandboxes outlive their host on
    # purpose), then SIGTERM: the host waits for those releases and stops
    # its idle sandboxes.
    base=$("${SUDO[@]}" cat "$data/base-url") key=$("${SUDO[@]}" cat "$data/api-key")
    for id in $(curl -fsS -H "Authorization: Bearer $key" "$base/local-sandbox" \
      | grep -o '"local_sandbox_id": *"[^"]*"' | sed 's/.*"\([^"]*\)"$/\1/'); do
      curl -fsS -o /dev/null -X DELETE -H "Authorization: Bearer $key" "$base/local-sandbox/$id" || true
    done
    "${SUDO[@]}" kill -TERM "$pid"
    for _ in $(seq 150); do
      "${SUDO[@]}" kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
  fi
  # Anything of it still running (a sandbox that was busy): each slot's
  # agent leads its process group; pasta runs beside it.
  "${SUDO[@]}" sh -c 'for f in "$1"/slots/*/agent.pid "$1"/slots/*/pasta.pid; do
      p=$(cat "$f" 2>/dev/null) || continue
      kill -KILL -- "-$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null
    done; rm -f "$1/host.pid"; true' sh "$data"
  say "stopped the host of $data"
  exit 0
fi

if [ "$install" = 1 ]; then
  say "installing what is missing"
  pkgs=()
  command -v curl >/dev/null || pkgs+=(curl ca-certificates)
  command -v cc >/dev/null || pkgs+=(gcc libc6-dev)                # the linker, zstd's C code
  command -v git >/dev/null || pkgs+=(git)                          # the git MCP server
  command -v node >/dev/null || pkgs+=(nodejs npm)                  # npm MCP servers
  # PyPI MCP servers: their venvs use the system's interpreter, whatever
  # python3 is first on PATH (pyenv's under a home is not for them).
  /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || pkgs+=(python3 python3-venv)
  # The sandbox's own PATH (no host PATH reaches it) finds `python` for
  # code runners as the benchmarks' images have it.
  [ -x /usr/bin/python ] || pkgs+=(python-is-python3)
  command -v bwrap >/dev/null || pkgs+=(bubblewrap)                 # the sandboxes' namespaces
  command -v newuidmap >/dev/null || pkgs+=(uidmap)                 # their user namespace
  command -v unshare >/dev/null || pkgs+=(util-linux)
  command -v pasta >/dev/null || pkgs+=(passt)                      # their outbound network
  command -v ip >/dev/null || pkgs+=(iproute2)
  if [ -z "$servers" ]; then                                         # every shipped server
    command -v chromium >/dev/null || pkgs+=(chromium)              # playwright
    dpkg -s dovecot-imapd >/dev/null 2>&1 || pkgs+=(dovecot-imapd)  # the mail service
  fi
  if [ ${#pkgs[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || die "missing ${pkgs[*]}, and no apt-get to install them"
    "${SUDO[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${pkgs[@]}"
  fi
  # Subordinate ids of the user the host runs as (root): 64 slots of 65,536.
  for f in /etc/subuid /etc/subgid; do
    grep -q '^root:' "$f" 2>/dev/null || echo "root:1000000:4194304" | "${SUDO[@]}" tee -a "$f" >/dev/null
  done
  export PATH="$HOME/.cargo/bin:$PATH"
  if ! command -v cargo >/dev/null; then
    say "no cargo: installing Rust with rustup (https://rustup.rs)"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  fi
  # shellcheck disable=SC2086
  "${SUDO[@]}" packaging/install-servers.sh --prefix /opt/sandbox-agent/servers $servers
fi
export PATH="$HOME/.cargo/bin:$PATH"

say "building (cargo build --release)"
cargo build --locked --release -p sandbox-host -p sandbox-agent -p sandboxctl
target=$(cargo metadata --format-version 1 --no-deps | sed 's/.*"target_directory":"\([^"]*\)".*/\1/')
bin=$target/release

# Each sandbox's root is an unprivileged user of this host: it must be able
# to pass through the directories above what it is shown.
need_traverse() {
  local d=$1
  while [ "$d" != / ]; do
    d=$(dirname "$d")
    [ $(($(stat -c '0%a' "$d") & 1)) = 1 ] \
      || die "$2 is below $d, which other users cannot pass through: \`chmod o+x $d\`, or use a checkout elsewhere"
  done
}
need_traverse "$bin/sandbox-agent" "the agent binary"
need_traverse "$repo/packaging/servers.toml" "the manifest"

# Sandboxes see /usr, /etc and /opt: the servers' virtual environments are
# made with the system's python3 (install-servers.sh), never one under a
# home; a node from elsewhere (nvm) is shown read-only.
ro=()
add_ro() {
  case $1 in /usr | /usr/* | /etc | /etc/* | /opt | /opt/*) return ;; esac
  for r in "${ro[@]}"; do [ "$r" = "$1" ] && return; done
  need_traverse "$1/." "$1"
  ro+=("$1")
}
node=$(command -v node || true)
[ -n "$node" ] && add_ro "$(dirname "$(dirname "$(realpath "$node")")")"
ro_args=()
for r in "${ro[@]}"; do ro_args+=(--sandbox-ro "$r"); done

mkdir_data
if [ -f "$data/host.pid" ] && "${SUDO[@]}" kill -0 "$("${SUDO[@]}" cat "$data/host.pid")" 2>/dev/null; then
  die "a host of $data is running already: ./quickstart.sh --stop --data-dir $data"
fi
# A random key, in a file only root reads (never on a command line).
key=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
(umask 077 && echo "$key" | "${SUDO[@]}" tee "$data/api-key" >/dev/null)
"${SUDO[@]}" chmod 600 "$data/api-key"

say "starting sandbox-host (log: $data/host.log)"
: | "${SUDO[@]}" tee "$data/host.log" >/dev/null
# setsid: the host leads a process group of its own and outlives this shell;
# its pid is in DIR/host.pid.
"${SUDO[@]}" setsid --fork sh -c 'd=$1; shift; echo $$ >"$d/host.pid"; exec "$@" >>"$d/host.log" 2>&1 </dev/null' \
  sh "$data" "$bin/sandbox-host" --listen "$listen" --data-dir "$data" \
  --manifest "$repo/packaging/servers.toml" --api-key-file "$data/api-key" \
  --pool-size "$pool" "${ro_args[@]}"

# The host serves once its discovery catalogs are recorded (every server
# started once, in a sandbox of its own: a minute or two at the first
# start; a restart finds them made).
echo "waiting for sandbox-host (its first start records the servers' discovery catalogs: a minute or two)…"
base=""
for _ in $(seq 3000); do
  base=$("${SUDO[@]}" sed -n 's/^sandbox-host: base URL //p' "$data/host.log" 2>/dev/null || true)
  [ -n "$base" ] && curl -fsS -o /dev/null -H "Authorization: Bearer $key" "$base/local-sandbox" 2>/dev/null && break
  pid=$("${SUDO[@]}" cat "$data/host.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && ! "${SUDO[@]}" kill -0 "$pid" 2>/dev/null; then
    "${SUDO[@]}" tail -n 20 "$data/host.log" >&2
    die "sandbox-host exited (its log above)"
  fi
  base=""
  sleep 0.2
done
[ -n "$base" ] || die "sandbox-host did not answer within 600 s (log: $data/host.log)"
echo "$base" | "${SUDO[@]}" tee "$data/base-url" >/dev/null

cat <<EOF

sandbox-host is running (pid $("${SUDO[@]}" cat "$data/host.pid"), process backend, isolated sandboxes).

  base URL  $base
  API key   $key
            (in $data/api-key)

Acquire a sandbox with the filesystem server, list yours, release one:

  export SANDBOX_URL=$base SANDBOX_KEY=$key
  curl -s -X POST \$SANDBOX_URL/local-sandbox -H "Authorization: Bearer \$SANDBOX_KEY" \\
    -H 'Content-Type: application/json' -d '{"server_names": ["filesystem"]}'
  curl -s \$SANDBOX_URL/local-sandbox -H "Authorization: Bearer \$SANDBOX_KEY"
  curl -s -X DELETE \$SANDBOX_URL/local-sandbox/LOCAL_SANDBOX_ID -H "Authorization: Bearer \$SANDBOX_KEY"

The acquire's mcp_server_url is a streamable-HTTP MCP endpoint for any MCP
client. The whole API: $base/openapi.json, and docs/host.md.
Stop the host: ./quickstart.sh --stop$([ "$data" = /var/lib/sandbox-host ] || echo " --data-dir $data")
EOF
