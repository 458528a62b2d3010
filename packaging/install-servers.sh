#!/usr/bin/env bash
# Installs the pinned MCP servers of packaging/servers.toml.
#
#   packaging/install-servers.sh [--prefix DIR] [NAME ...]
#
# DIR defaults to /opt/sandbox-agent/servers (the manifest's install_dir).
# With NAMEs, only those servers are installed (the tests install the ones
# they use); without, all of them. Re-running is cheap: a server whose pinned
# version is already installed is skipped.
#
# Layout: DIR/node (one npm prefix for the npm servers), DIR/node@BENCH (a
# benchmark's pinned versions) and DIR/py/NAME (one virtualenv per Python
# server, NAME@BENCH for a benchmark's pins, so dependencies never
# conflict). Python servers install PIP_JOBS (4) at a time.
# Needs node/npm and python3 with venv; `apt-get install python3-venv
# nodejs npm` on Debian. The playwright server uses Debian's chromium
# (`apt-get install chromium`), so no browser is downloaded.
set -euo pipefail

PREFIX=/opt/sandbox-agent/servers
HERE=$(cd "$(dirname "$0")" && pwd)
if [[ "${1:-}" == "--prefix" ]]; then
    PREFIX=$2
    shift 2
fi

# name | kind | package==version | extra pip requirements and flags
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
    "filesystem@MCP_Atlas|npm|@modelcontextprotocol/server-filesystem@2026.7.10"
    "localmemory@MCP_Atlas|npm|@modelcontextprotocol/server-memory@2025.8.4"
    "code-runner@MCP_Atlas|npm|mcp-server-code-runner@0.1.7"
    "git@MCP_Atlas|pip|mcp-server-git==2026.7.10|$MCP1 --uploaded-prior-to=2026-07-11T00:00:00Z"
    "arxiv@MCP_Atlas|pip|arxiv-mcp-server==0.2.11|--uploaded-prior-to=2025-06-07T00:00:00Z"
    "filesystem@Toolathlon|npm|@modelcontextprotocol/server-filesystem@2025.7.1"
    "localmemory@Toolathlon|npm|@modelcontextprotocol/server-memory@2025.4.25"
    "git@Toolathlon|pip|mcp-server-git==2025.1.14|--uploaded-prior-to=2025-01-15T00:00:00Z"
    "arxiv@Toolathlon|pip|arxiv-mcp-server==0.2.10|--uploaded-prior-to=2025-04-23T00:00:00Z"
    "excel@Toolathlon|pip|excel-mcp-server==0.1.4|--uploaded-prior-to=2025-06-11T00:00:00Z"
    "word@Toolathlon|pip|office-word-mcp-server==1.1.9|--uploaded-prior-to=2025-08-07T00:00:00Z"
    "powerpoint@Toolathlon|pip|office-powerpoint-mcp-server==2.0.6|--uploaded-prior-to=2025-08-07T00:00:00Z"
    "poste_email_toolathlon@Toolathlon|pip|emails-mcp==0.1.12|aiosmtpd==1.4.6 --ignore-requires-python --uploaded-prior-to=2025-09-01T00:00:00Z"
)

# How many pip installs run at once (they wait on the network mostly).
PIP_JOBS=${PIP_JOBS:-4}

want() {
    [[ $# -eq 0 ]] && return 0
    local n=$1; shift
    for w in "${SELECTED[@]}"; do [[ "$w" == "$n" ]] && return 0; done
    return 1
}

SELECTED=("$@")
for s in "${SELECTED[@]}"; do
    found=0
    for line in "${SERVERS[@]}"; do [[ "${line%%|*}" == "$s" ]] && found=1; done
    if [[ $found == 0 ]]; then
        echo "install-servers: unknown server '$s'; known: $(printf '%s ' "${SERVERS[@]%%|*}")" >&2
        exit 2
    fi
done

# One npm prefix per benchmark's pins (node, node@MCP_Atlas, …), so two
# versions of a package never meet.
npm_prefix() { [[ $1 == *@* ]] && echo "$PREFIX/node@${1#*@}" || echo "$PREFIX/node"; }

# One virtualenv per Python server; then its launchers, which adapt it to
# how the agent passes credentials (environment variables), written with
# the venv's python.
pip_install() {
    local name=$1 pkg=$2 flags=$3 venv=$PREFIX/py/$1
    echo "install-servers: $name: pip install $pkg"
    rm -rf "$venv"
    python3 -m venv "$venv"
    if [[ $flags == *--uploaded-prior-to* ]]; then
        "$venv/bin/pip" install --quiet --disable-pip-version-check pip==26.3
    fi
    # shellcheck disable=SC2086
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$pkg" $flags
    echo "$pkg $flags" >"$venv/.installed"
}
pip_launchers() {
    local name=$1 bin=$PREFIX/py/$1/bin
    local l launchers=()
    case ${name%@*} in
    poste_email_toolathlon) launchers=(emails-mcp-env sandbox-mail) ;;
    canvas) launchers=(canvas-data) ;;
    google_cloud) launchers=(google-cloud-data) ;;
    esac
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

mkdir -p "$PREFIX/node" "$PREFIX/py"
declare -A npm_pkgs=()
pip_names=()
pip_pids=()
for line in "${SERVERS[@]}"; do
    IFS='|' read -r name kind pkg flags <<<"$line"
    if [[ ${#SELECTED[@]} -gt 0 ]] && ! want "$name" "${SELECTED[@]}"; then continue; fi
    case $kind in
    npm)
        base=${pkg%@*}
        ver=${pkg##*@}
        np=$(npm_prefix "$name")
        have=$(node -p "require('$np/node_modules/$base/package.json').version" 2>/dev/null || true)
        if [[ "$have" == "$ver" ]]; then
            echo "install-servers: $name ($pkg) already installed"
        else
            npm_pkgs[$np]+="$pkg "
        fi
        ;;
    pip)
        stamp=$PREFIX/py/$name/.installed
        if [[ -f $stamp && "$(cat "$stamp")" == "$pkg $flags" ]]; then
            echo "install-servers: $name ($pkg) already installed"
        else
            # At most PIP_JOBS at once: wait for the oldest first. Each is
            # waited for exactly once, so a failure stops the script.
            if [[ ${#pip_pids[@]} -ge $PIP_JOBS ]]; then
                wait "${pip_pids[0]}"
                pip_pids=("${pip_pids[@]:1}")
            fi
            pip_install "$name" "$pkg" "$flags" &
            pip_pids+=($!)
        fi
        pip_names+=("$name")
        ;;
    esac
done
# Every pip install must have succeeded (set -e stops at the first failure).
for pid in "${pip_pids[@]}"; do wait "$pid"; done
for name in "${pip_names[@]}"; do pip_launchers "$name"; done
for np in "${!npm_pkgs[@]}"; do
    # shellcheck disable=SC2206
    pkgs=(${npm_pkgs[$np]})
    echo "install-servers: npm install --prefix $np ${pkgs[*]}"
    mkdir -p "$np"
    # No browser downloads (playwright, and puppeteer pulled in by
    # desktop-commander): the playwright server uses Debian's chromium.
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 PUPPETEER_SKIP_DOWNLOAD=1 npm install --no-audit --no-fund --loglevel=error \
        --prefix "$np" "${pkgs[@]}"
done
# desktop-commander's launcher (MCP_Atlas's allowedDirectories).
if [[ ${#SELECTED[@]} -eq 0 ]] || want desktop-commander "${SELECTED[@]}"; then
    install -D -m 0755 "$HERE/launchers/desktop-commander-env.mjs" "$PREFIX/node/launchers/desktop-commander-env.mjs"
fi
# localmemory's data tool (Klavis's LocalMemoryData; the system's python3).
if [[ ${#SELECTED[@]} -eq 0 ]] || want localmemory "${SELECTED[@]}"; then
    install -D -m 0755 "$HERE/launchers/memory-data" "$PREFIX/bin/memory-data"
fi
echo "install-servers: done ($PREFIX)"
