#!/usr/bin/env bash
# Installs the MCP servers of packaging/servers.toml exactly as locked in
# packaging/locks/ (see packaging/locks/README.md).
#
#   packaging/install-servers.sh [--prefix DIR] [NAME ...]
#   packaging/install-servers.sh --lock [NAME ...]
#   packaging/install-servers.sh --help
#
# DIR defaults to /opt/sandbox-agent/servers (the manifest's install_dir).
# With NAMEs, only those servers are installed (the tests install the ones
# they use); without, all of them. An npm server comes with the rest of its
# prefix's lock (npm ci installs a lock whole).
#
# What runs is what the locks say: each npm prefix (DIR/node, DIR/node@BENCH
# for a benchmark's pins) is `npm ci` of its committed package-lock.json;
# each Python server gets a virtualenv of its own (DIR/py/NAME,
# DIR/py/NAME@BENCH) made with the system's interpreter (PYTHON, default
# /usr/bin/python3: never one under a home, which sandboxes cannot see) and
# filled with `pip install --require-hashes --no-deps` of its lock. Re-running
# is cheap: an install whose stamp (the lock's sha256) matches and whose
# tree still matches its lock is kept; a tree that differs from its lock is
# reinstalled; a lock that cannot be installed stops the script naming the
# server. Python servers install PIP_JOBS (4) at a time.
#
# --lock regenerates the locks of the NAMEd servers (all without NAMEs)
# from the table below, on this machine (CPython 3.11, x86_64 Linux: the
# Python locks hold the hashes of the files pip picks here): every pin
# resolves its dependencies as they were when it was released (npm
# --before, pip --uploaded-prior-to), except where the table says.
#
# Needs node/npm and python3 with venv; `apt-get install python3-venv
# nodejs npm` on Debian. The playwright server uses Debian's chromium
# (`apt-get install chromium`), so no browser is downloaded.
set -euo pipefail

PREFIX=/opt/sandbox-agent/servers
HERE=$(cd "$(dirname "$0")" && pwd)
LOCKS=$HERE/locks
PYTHON=${PYTHON:-/usr/bin/python3}
# How many pip installs run at once (they wait on the network mostly).
PIP_JOBS=${PIP_JOBS:-4}

usage() { sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "install-servers: $*" >&2; exit 1; }

mode=install
SELECTED=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --prefix)
        [[ $# -ge 2 ]] || { echo "install-servers: --prefix needs a directory (see --help)" >&2; exit 2; }
        PREFIX=$2
        shift 2
        ;;
    --lock) mode=lock; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "install-servers: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) SELECTED+=("$1"); shift ;;
    esac
done

# name | kind | package==version | what --lock resolves with it (pip:
# extra requirements and flags, --ignore-requires-python also used at
# install; npm: overrides, [PARENT>]DEP@VERSION, where the registry's
# publish time of a pin is later than its release, so --before cannot
# find the dependencies it was released with)
#
# Toolathlon's filesystem 2025.7.1 (released 2025-07-01, published here
# 2026-03-21) gets the MCP SDK and zod of its release (1.13.2, zod 3):
# with today's (zod 4) its zod-to-json-schema lists 11 of its 12 tools
# without arguments.
#
# MCP1 pins the MCP SDK to 1.x for servers that import its 1.x API
# (mcp.server.fastmcp) without an upper bound; mcp 2.x removed that module.
MCP1='mcp>=1.10,<2'

SERVERS=(
    "filesystem|npm|@modelcontextprotocol/server-filesystem@2026.8.31"
    "localmemory|npm|@modelcontextprotocol/server-memory@2026.8.31"
    "desktop-commander|npm|@wonderwhy-er/desktop-commander@0.2.52"
    "code-runner|npm|mcp-server-code-runner@0.1.8"
    "playwright|npm|@playwright/mcp@0.0.83"
    "git|pip|mcp-server-git==2026.10.19"
    "terminal|pip|cli-mcp-server==0.2.5|$MCP1"
    "arxiv|pip|arxiv-mcp-server==0.8.2"
    "excel|pip|excel-mcp-server==2.2.2"
    "word|pip|office-word-mcp-server==1.1.11"
    "powerpoint|pip|office-powerpoint-mcp-server==2.0.7|$MCP1"
    "code-executor|pip|mcp-python-interpreter==1.2.3|$MCP1"
    "google_cloud|pip|google-cloud-mcp==1.0.0|$MCP1"
    "canvas|pip|canvas-mcp==1.16.0"
    # These two declare Python >= 3.12; Debian 12 has 3.11, on which they
    # run unchanged, so the check is skipped.
    "pdf-tools|pip|pdf-tools-mcp==0.1.4|$MCP1 --ignore-requires-python"
    # aiosmtpd: the SMTP side of the sandbox's mail service (sandbox-mail).
    "poste_email_toolathlon|pip|emails-mcp==0.1.9|$MCP1 aiosmtpd==1.4.6 --ignore-requires-python"

    # Public-data servers: Klavis serves each as a sandbox of its own
    # (/sandbox/NAME), MCP_Atlas's versions (its mcp_server_template.json).
    # They call public web APIs when a tool is used. osm-mcp-server declares
    # Python >= 3.13 and runs unchanged on 3.11.
    "calculator|pip|mcp-server-calculator==0.2.0|$MCP1"
    "osm|pip|osm-mcp-server==0.1.1|$MCP1 --ignore-requires-python"
    "wikipedia|pip|wikipedia-mcp==2.0.1"
    "context7|npm|@upstash/context7-mcp@1.0.14"
    "open_library|npm|@geobio/mcp-open-library@0.1.6"

    # The versions a benchmark pins where they differ from the above,
    # installed side by side (NAME@BENCH: npm into DIR/node@BENCH, pip into
    # DIR/py/NAME@BENCH) for servers.toml's profiles. From the benchmarks'
    # repositories (../shared/benchmarks.md); their GitHub forks and the
    # packages missing from the registries are not here (docs/profiles.md). A Python
    # pin resolves its dependencies as they were the day after its release
    # (--uploaded-prior-to, pip >= 25.3): today's pydantic and MCP SDK break
    # most of them.
    # MCP_Atlas: the pins of Klavis's MCP_Atlas integration (zihaolin96/
    # mcp-atlas; packaging/launches.toml says why that source). Its
    # filesystem 2025.11.25 fails its own output validation in three tools
    # (modelcontextprotocol/servers#3106): 2025.12.18, the next release,
    # has the fix and the same tools (packaging/pins.toml).
    "filesystem@MCP_Atlas|npm|@modelcontextprotocol/server-filesystem@2025.12.18"
    "localmemory@MCP_Atlas|npm|@modelcontextprotocol/server-memory@2025.8.4"
    "code-runner@MCP_Atlas|npm|mcp-server-code-runner@0.1.7"
    # MCP_Atlas pins desktop-commander 0.2.7, which npm does not publish:
    # 0.2.10 is the nearest with 0.2.7's 21 tools and their schemas
    # (packaging/pins.toml says what else differs). Its dependencies are
    # those of 2026-05-08: @vscode/ripgrep before 1.18.0 downloads its
    # binary from GitHub at install, 1.18.0 takes it from npm.
    "desktop-commander@MCP_Atlas|npm|@wonderwhy-er/desktop-commander@0.2.10|--before=2026-05-08T00:00:00Z"
    "git@MCP_Atlas|pip|mcp-server-git==2025.7.1|--uploaded-prior-to=2025-07-02T00:00:00Z"
    "arxiv@MCP_Atlas|pip|arxiv-mcp-server==0.2.11|--uploaded-prior-to=2025-06-07T00:00:00Z"
    # MCP_Atlas's mcp-code-executor (@geobio/code_execution_server 0.2.1)
    # is published nowhere reachable: the server is our own
    # (launchers/mcp-code-executor), in a venv with the MCP SDK and uv (for
    # install_dependencies). The packages MCP_Atlas's image gives the code
    # it runs (its workspace's pyproject: pandas, numpy, scipy) come with
    # the benchmark's data: install-benchmark-data.sh runs the image's `uv
    # sync` there.
    "code-executor@MCP_Atlas|pip|mcp>=1.10,<2|uv"
    "filesystem@Toolathlon|npm|@modelcontextprotocol/server-filesystem@2025.7.1|@modelcontextprotocol/server-filesystem>@modelcontextprotocol/sdk@1.13.2 zod@3.25.76"
    "localmemory@Toolathlon|npm|@modelcontextprotocol/server-memory@2025.4.25"
    # Toolathlon runs @lockon0927/playwright-mcp-with-chunk 0.1.2 (npm: 404),
    # a fork of @playwright/mcp 0.0.32 with snapshot spans: its base.
    "playwright@Toolathlon|npm|@playwright/mcp@0.0.32"
    "git@Toolathlon|pip|mcp-server-git==2025.1.14|--uploaded-prior-to=2025-01-15T00:00:00Z"
    "arxiv@Toolathlon|pip|arxiv-mcp-server==0.2.10|--uploaded-prior-to=2025-04-23T00:00:00Z"
    "excel@Toolathlon|pip|excel-mcp-server==0.1.4|--uploaded-prior-to=2025-06-11T00:00:00Z"
    "word@Toolathlon|pip|office-word-mcp-server==1.1.9|--uploaded-prior-to=2025-08-07T00:00:00Z"
    "powerpoint@Toolathlon|pip|office-powerpoint-mcp-server==2.0.6|--uploaded-prior-to=2025-08-07T00:00:00Z"
    "poste_email_toolathlon@Toolathlon|pip|emails-mcp==0.1.12|aiosmtpd==1.4.6 --ignore-requires-python --uploaded-prior-to=2025-09-01T00:00:00Z"
)

for s in "${SELECTED[@]}"; do
    found=0
    for line in "${SERVERS[@]}"; do [[ "${line%%|*}" == "$s" ]] && found=1; done
    if [[ $found == 0 ]]; then
        echo "install-servers: unknown server '$s'; known: $(printf '%s ' "${SERVERS[@]%%|*}")" >&2
        exit 2
    fi
done
want() {
    [[ ${#SELECTED[@]} -eq 0 ]] && return 0
    local w
    for w in "${SELECTED[@]}"; do [[ "$w" == "$1" ]] && return 0; done
    return 1
}

# The npm prefix of a server: node, or node@BENCH for a benchmark's pins,
# so two versions of a package never meet.
npm_key() { [[ $1 == *@* ]] && echo "node@${1#*@}" || echo "node"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

# shellcheck source=locks/lock.sh
. "$LOCKS/lock.sh"

if [[ $mode == lock ]]; then
    lock_all
    exit 0
fi

# The interpreter of every venv must be one an isolated sandbox shows
# (/usr) or one installed under the prefix, never one under a home.
py_real=$(realpath -e "$PYTHON" 2>/dev/null) || die "no Python interpreter $PYTHON (apt-get install python3-venv, or PYTHON=...)"
case $py_real in
/usr/* | "$PREFIX"/*) ;;
*) die "PYTHON=$PYTHON is $py_real, outside /usr and $PREFIX: the sandboxes would not see the servers' interpreter; use /usr/bin/python3 or one installed under $PREFIX" ;;
esac
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || die "$PYTHON has no venv/ensurepip (apt-get install python3-venv)"

# Whether the venv $1 holds exactly the lock $2 (names and versions; pip
# and setuptools, which venv brings, may be there unlocked) and was made
# with this interpreter.
py_matches() {
    local venv=$1 lock=$2 home
    home=$(sed -n 's/^home *= *//p' "$venv/pyvenv.cfg" 2>/dev/null) || return 1
    [[ $(realpath -e "$home" 2>/dev/null) == "$(dirname "$py_real")" ]] || return 1
    "$venv/bin/python" "$LOCKS/pylock.py" check "$lock"
}

# One virtualenv per Python server, filled from its lock; a tree that
# matches its lock and stamp is kept.
pip_install() {
    local name=$1 flags=$2 venv=$PREFIX/py/$1 lock=$LOCKS/py/$1.txt stamp
    [[ -f $lock ]] || die "$name: no lock $lock (packaging/install-servers.sh --lock $name)"
    stamp="$(sha "$lock") $py_real"
    if [[ -f $venv/.installed && "$(cat "$venv/.installed")" == "$stamp" ]]; then
        if py_matches "$venv" "$lock" 2>/dev/null; then
            echo "install-servers: $name already installed ($(basename "$lock"))"
            return 0
        fi
        echo "install-servers: $name: the installed tree differs from its lock; reinstalling"
    fi
    echo "install-servers: $name: pip install --require-hashes -r locks/py/$name.txt"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    local extra=()
    [[ $flags == *--ignore-requires-python* ]] && extra+=(--ignore-requires-python)
    # --no-build-isolation: the two locked sdists (sgmllib3k, pyperclip)
    # build with the venv's own setuptools; an isolated build would fetch
    # setuptools from the index unhashed (pip does not hash-check build
    # dependencies), so a venv without one fails here instead.
    PIP_FIND_LINKS='' "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps \
        --no-build-isolation --require-hashes "${extra[@]}" -r "$lock" \
        || die "$name: its lock $lock cannot be installed (above: pip's reason)"
    py_matches "$venv" "$lock" || die "$name: the venv does not match its lock $lock after installing it"
    echo "$stamp" >"$venv/.installed"
}
pip_launchers() {
    local name=$1 bin=$PREFIX/py/$1/bin
    local l launchers=()
    case ${name%@*} in
    poste_email_toolathlon) launchers=(emails-mcp-env sandbox-mail) ;;
    canvas) launchers=(canvas-data) ;;
    google_cloud) launchers=(google-cloud-data) ;;
    esac
    [[ $name == code-executor@MCP_Atlas ]] && launchers=(mcp-code-executor)
    for l in "${launchers[@]}"; do
        { echo "#!$bin/python3"; tail -n +2 "$HERE/launchers/$l"; } >"$bin/$l"
        chmod 755 "$bin/$l"
    done
    # excel-mcp-server 0.1.4 (Toolathlon's pin) logs into its own install
    # (lib/python3.X/excel-mcp.log), which its unprivileged user cannot
    # write (and an isolated sandbox sees read-only): the log goes to the
    # sandbox's /tmp instead.
    if [ "$name" = excel@Toolathlon ]; then
        local lib
        for lib in "$PREFIX/py/$name"/lib/python3*; do
            ln -sfn /tmp/excel-mcp.log "$lib/excel-mcp.log"
        done
    fi
}

# An npm prefix from its lock: `npm ci` (which installs exactly the lock,
# or fails), kept when its stamp and tree match the lock.
npm_install() {
    local key=$1 names=$2 np=$PREFIX/$1 dir=$LOCKS/npm/$1 stamp
    [[ -f $dir/package-lock.json ]] || die "$names: no lock $dir/package-lock.json (packaging/install-servers.sh --lock)"
    stamp=$(sha "$dir/package-lock.json")
    if [[ -f $np/.installed && "$(cat "$np/.installed")" == "$stamp" ]]; then
        if node "$LOCKS/check-npm.js" "$np" 2>/dev/null; then
            echo "install-servers: $names already installed (locks/npm/$key)"
            return 0
        fi
        echo "install-servers: $key: the installed tree differs from its lock; reinstalling"
    fi
    echo "install-servers: $names: npm ci --prefix $np (locks/npm/$key)"
    mkdir -p "$np"
    rm -f "$np/.installed"
    cp "$dir/package.json" "$dir/package-lock.json" "$np/"
    # No browser downloads (playwright, and puppeteer pulled in by
    # desktop-commander): the playwright server uses Debian's chromium.
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 PUPPETEER_SKIP_DOWNLOAD=1 npm ci --no-audit --no-fund \
        --loglevel=error --prefix "$np" \
        || die "$names: the lock locks/npm/$key cannot be installed (above: npm's reason)"
    node "$LOCKS/check-npm.js" "$np" || die "$names: $np does not match its lock after npm ci"
    echo "$stamp" >"$np/.installed"
}

mkdir -p "$PREFIX/node" "$PREFIX/py"
declare -A npm_names=()
pip_names=()
pip_pids=()
for line in "${SERVERS[@]}"; do
    IFS='|' read -r name kind pkg flags <<<"$line"
    want "$name" || continue
    case $kind in
    npm) npm_names[$(npm_key "$name")]+="$name " ;;
    pip)
        # At most PIP_JOBS at once: wait for the oldest first. Each is
        # waited for exactly once, so a failure stops the script.
        if [[ ${#pip_pids[@]} -ge $PIP_JOBS ]]; then
            wait "${pip_pids[0]}"
            pip_pids=("${pip_pids[@]:1}")
        fi
        pip_install "$name" "$flags" &
        pip_pids+=($!)
        pip_names+=("$name")
        ;;
    esac
done
# Every pip install must have succeeded (set -e stops at the first failure).
for pid in "${pip_pids[@]}"; do wait "$pid"; done
for name in "${pip_names[@]}"; do pip_launchers "$name"; done
for key in "${!npm_names[@]}"; do npm_install "$key" "${npm_names[$key]% }"; done
# desktop-commander's launcher (MCP_Atlas's allowedDirectories).
if want desktop-commander || want desktop-commander@MCP_Atlas; then
    install -D -m 0755 "$HERE/launchers/desktop-commander-env.mjs" "$PREFIX/node/launchers/desktop-commander-env.mjs"
fi
# localmemory's data tool (Klavis's LocalMemoryData; the system's python3).
if want localmemory; then
    install -D -m 0755 "$HERE/launchers/memory-data" "$PREFIX/bin/memory-data"
fi
echo "install-servers: done ($PREFIX)"
