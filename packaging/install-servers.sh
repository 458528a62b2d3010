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
# Layout: DIR/node (one npm prefix for the npm servers) and DIR/py/NAME (one
# virtualenv per Python server, so their dependencies never conflict).
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
)

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

mkdir -p "$PREFIX/node" "$PREFIX/py"
npm_pkgs=()
for line in "${SERVERS[@]}"; do
    IFS='|' read -r name kind pkg flags <<<"$line"
    if [[ ${#SELECTED[@]} -gt 0 ]] && ! want "$name" "${SELECTED[@]}"; then continue; fi
    case $kind in
    npm)
        base=${pkg%@*}
        ver=${pkg##*@}
        have=$(node -p "require('$PREFIX/node/node_modules/$base/package.json').version" 2>/dev/null || true)
        if [[ "$have" == "$ver" ]]; then
            echo "install-servers: $name ($pkg) already installed"
        else
            npm_pkgs+=("$pkg")
        fi
        ;;
    pip)
        venv=$PREFIX/py/$name
        stamp=$venv/.installed
        if [[ -f $stamp && "$(cat "$stamp")" == "$pkg $flags" ]]; then
            echo "install-servers: $name ($pkg) already installed"
        else
            echo "install-servers: $name: pip install $pkg"
            rm -rf "$venv"
            python3 -m venv "$venv"
            # shellcheck disable=SC2086
            "$venv/bin/pip" install --quiet --disable-pip-version-check "$pkg" $flags
            echo "$pkg $flags" >"$stamp"
        fi
        ;;
    esac
    # Launchers that adapt a server to how the agent passes credentials
    # (environment variables), installed next to it with its venv's python.
    case $name in
    poste_email_toolathlon)
        { echo "#!$PREFIX/py/$name/bin/python3"; tail -n +2 "$HERE/launchers/emails-mcp-env"; } \
            >"$PREFIX/py/$name/bin/emails-mcp-env"
        chmod 755 "$PREFIX/py/$name/bin/emails-mcp-env"
        { echo "#!$PREFIX/py/$name/bin/python3"; tail -n +2 "$HERE/launchers/sandbox-mail"; } \
            >"$PREFIX/py/$name/bin/sandbox-mail"
        chmod 755 "$PREFIX/py/$name/bin/sandbox-mail"
        ;;
    esac
done
if [[ ${#npm_pkgs[@]} -gt 0 ]]; then
    echo "install-servers: npm install ${npm_pkgs[*]}"
    # No browser downloads (playwright, and puppeteer pulled in by
    # desktop-commander): the playwright server uses Debian's chromium.
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 PUPPETEER_SKIP_DOWNLOAD=1 npm install --no-audit --no-fund --loglevel=error \
        --prefix "$PREFIX/node" "${npm_pkgs[@]}"
fi
# desktop-commander's launcher (MCP_Atlas's allowedDirectories).
if [[ ${#SELECTED[@]} -eq 0 ]] || want desktop-commander "${SELECTED[@]}"; then
    install -D -m 0755 "$HERE/launchers/desktop-commander-env.mjs" "$PREFIX/node/launchers/desktop-commander-env.mjs"
fi
echo "install-servers: done ($PREFIX)"
