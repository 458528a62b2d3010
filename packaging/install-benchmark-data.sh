#!/usr/bin/env bash
# Installs the data a benchmark's sandboxes must come with (MCP_Atlas: its
# CSV files, memory graph and repositories, which its harness never
# uploads), checked file by file against pinned SHA-256 sums.
#
#   packaging/install-benchmark-data.sh BENCH --from DIR|URL [--pins FILE] [--prefix DIR]
#                                       [--repos CSV] [--git-mirror BASE]
#                                       [--python PY] [--exclude-newer DATE]
#   packaging/install-benchmark-data.sh BENCH --pin --from DIR [--pins FILE]
#
# --from   a directory, or an http(s)/file URL of a tar archive (.tar,
#          .tar.gz, .tar.zst; GNU tar detects the compression) whose
#          top level is the data (MCP_Atlas: what its image has at /data,
#          services/agent-environment/data/ of scaleapi/mcp-atlas).
# --pins   the pinned sums, in sha256sum's format with paths relative to
#          the data's top: packaging/benchmark-data/BENCH.sha256 by default.
#          Nothing third-party is kept in this repository, only these sums.
# --prefix where data lives: PREFIX/BENCH, which servers.toml's
#          [benchmarks.BENCH] data names. Default /opt/sandbox-agent/benchmark-data.
# --pin    writes the pins from a copy you trust (e.g. a checkout of the
#          benchmark's repository at its pinned commit) instead of installing.
#
# Every pinned file must be present with its sum, and nothing else may be
# there (no unpinned file, no symlink, no device); otherwise nothing is
# installed and the offending paths are named.
#
# Repositories: when the checked data has repos/git_submodule_info.csv
# (MCP_Atlas: `url,sha,path` lines, no header, path /data/repos/NAME), each
# is cloned into repos/NAME with its full history and checked out at its
# pinned commit (detached HEAD), as MCP_Atlas's Dockerfile does (`git clone
# URL PATH; git checkout SHA`); a commit other than the pin fails the install.
# --repos CSV       that list from another file (same format) instead.
# --git-mirror BASE clone https://github.com/OWNER/NAME from BASE/OWNER/NAME
#                   (a directory or file:// URL of mirrors; git's
#                   url.BASE/.insteadOf). Each clone's origin stays the
#                   list's URL. Git's own insteadOf settings apply as well.
#
# uv projects: where the benchmark's image runs `uv sync` in its data
# (MCP_Atlas: repos/mcp_code_executor_workspace, whose pyproject.toml is
# pinned data), so does this when the data has that pyproject.toml, which needs uv (`pip install uv`): the same
# uv.lock and .venv, the venv's scripts naming /data/PATH/.venv as the
# image's do. The packages' directories (≈ 300 MB for MCP_Atlas) are kept
# once, read-only, in PREFIX/.BENCH-venv.ID; the data's .venv holds
# everything else of the venv (≈ 100 entries) and links each of them there,
# so an Acquire copies kilobytes, not the packages.
# --python PY          the venv's interpreter (default /usr/bin/python3: one
#                      a sandbox's user can run; the image's is 3.12).
# --exclude-newer DATE uv's --exclude-newer: what PyPI had then (default
#                      for MCP_Atlas 2026-07-18T00:00:00Z, as its image 1.2.7
#                      resolved; '' for none). uv's own variables apply too
#                      (UV_OFFLINE, UV_NO_INDEX, UV_FIND_LINKS, UV_INDEX_URL,
#                      UV_CACHE_DIR).
#
# The new tree replaces the old one by rename, so a sandbox never sees half
# of it.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX=/opt/sandbox-agent/benchmark-data
FROM=
PINS=
PIN=0
REPOS=
MIRROR=
PY=
EXCLUDE_NEWER=unset
die() { echo "install-benchmark-data: $*" >&2; exit 2; }

[[ $# -ge 1 ]] || die "usage: $0 BENCH --from DIR|URL [--pins FILE] [--prefix DIR] | BENCH --pin --from DIR"
BENCH=$1
shift
case $BENCH in
MCP_Atlas | Toolathlon | MCP_Mark) ;;
*) die "unknown benchmark '$BENCH'; one of MCP_Atlas, Toolathlon, MCP_Mark" ;;
esac
while [[ $# -gt 0 ]]; do
    case $1 in
    --from) FROM=${2:?--from needs a value}; shift 2 ;;
    --pins) PINS=${2:?--pins needs a value}; shift 2 ;;
    --prefix) PREFIX=${2:?--prefix needs a value}; shift 2 ;;
    --pin) PIN=1; shift ;;
    --repos) REPOS=${2:?--repos needs a value}; shift 2 ;;
    --git-mirror) MIRROR=${2:?--git-mirror needs a value}; shift 2 ;;
    --python) PY=${2:?--python needs a value}; shift 2 ;;
    --exclude-newer) EXCLUDE_NEWER=${2?--exclude-newer needs a value}; shift 2 ;;
    *) die "unknown argument '$1'" ;;
    esac
done
[[ -n $FROM ]] || die "--from DIR|URL is required"
PINS=${PINS:-$HERE/benchmark-data/$BENCH.sha256}
# Absolute: the checks run from inside the data.
[[ $PINS == /* ]] || PINS=$PWD/$PINS
[[ $PREFIX == /* ]] || PREFIX=$PWD/$PREFIX
if [[ -n $REPOS ]]; then
    [[ -f $REPOS ]] || die "--repos $REPOS is not a file"
    [[ $REPOS == /* ]] || REPOS=$PWD/$REPOS
fi
# A mirror directory given as a path: git reads it as one.
if [[ -n $MIRROR && $MIRROR != *://* ]]; then
    [[ -d $MIRROR ]] || die "--git-mirror $MIRROR is neither a directory nor a URL"
    MIRROR=$(cd "$MIRROR" && pwd)
fi

# The data's uv projects (relative to its top), as the benchmark's image
# syncs them, and the date its resolution stands at.
case $BENCH in
MCP_Atlas) UV_PROJECTS=(repos/mcp_code_executor_workspace) UV_DATE=2026-07-18T00:00:00Z ;;
*) UV_PROJECTS=() UV_DATE= ;;
esac
[[ $EXCLUDE_NEWER != unset ]] || EXCLUDE_NEWER=$UV_DATE
if [[ -z $PY ]]; then
    PY=python3
    [[ -x /usr/bin/python3 ]] && PY=/usr/bin/python3
fi

# Regular files only, as ./relative paths, sorted.
list_files() { (cd "$1" && find . -type f -print | LC_ALL=C sort); }
odd_entries() { (cd "$1" && find . ! -type f ! -type d -print | LC_ALL=C sort); }

if [[ $PIN == 1 ]]; then
    [[ -d $FROM ]] || die "--pin reads a directory; $FROM is not one"
    odd=$(odd_entries "$FROM")
    [[ -z $odd ]] || die "only regular files and directories can be pinned; found: $(echo "$odd" | head -5 | tr '\n' ' ')"
    mkdir -p "$(dirname "$PINS")"
    tmp=$PINS.part
    (cd "$FROM" && list_files . | sed 's|^\./||' | tr '\n' '\0' | xargs -0 -r sha256sum --) >"$tmp"
    mv "$tmp" "$PINS"
    echo "install-benchmark-data: pinned $(wc -l <"$PINS") files of $FROM in $PINS"
    exit 0
fi

[[ -s $PINS ]] || die "no pinned sums for $BENCH at $PINS: write them from a trusted copy with --pin --from DIR"

mkdir -p "$PREFIX"
STAGE=$(mktemp -d "$PREFIX/.$BENCH.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
mkdir "$STAGE/data"
case $FROM in
http://* | https://* | file://*)
    curl -fsSL --retry 3 -o "$STAGE/archive" "$FROM" || die "cannot download $FROM"
    tar -xf "$STAGE/archive" -C "$STAGE/data" --no-same-owner --no-same-permissions ||
        die "$FROM is not a tar archive tar can read"
    rm -f "$STAGE/archive"
    ;;
*)
    [[ -d $FROM ]] || die "$FROM is neither a directory nor an http(s)/file URL"
    cp -R --no-preserve=ownership "$FROM/." "$STAGE/data/"
    ;;
esac

odd=$(odd_entries "$STAGE/data")
[[ -z $odd ]] || die "refused: not regular files: $(echo "$odd" | head -5 | tr '\n' ' ')"
pinned=$(sed -E 's/^[0-9a-f]{64}  //; s|^|./|' "$PINS" | LC_ALL=C sort)
extra=$(comm -13 <(echo "$pinned") <(list_files "$STAGE/data"))
[[ -z $extra ]] || die "refused: files not in $PINS: $(echo "$extra" | head -5 | tr '\n' ' ')"
if ! bad=$(cd "$STAGE/data" && sha256sum --check --strict --quiet "$PINS" 2>&1); then
    die "refused: files missing or not as pinned in $PINS: $(echo "$bad" | head -5 | tr '\n' ' ')"
fi

# The repositories, into the checked tree (the pins cover the list itself;
# a copy of read-only data must first be made writable).
chmod -R u+rwX "$STAGE/data"
cloned=0
list=${REPOS:-$STAGE/data/repos/git_submodule_info.csv}
if [[ -f $list ]]; then
    command -v git >/dev/null || die "git is needed to clone the repositories of $list"
    git_cfg=(-c advice.detachedHead=false)
    [[ -z $MIRROR ]] || git_cfg+=(-c "url.${MIRROR%/}/.insteadOf=https://github.com/")
    seen=" "
    while IFS= read -r line || [[ -n $line ]]; do
        [[ -n $line ]] || continue
        IFS=, read -r url sha path extra <<<"$line"
        [[ -z $extra && -n $url && $url != -* ]] || die "$list: not a url,sha,path line: $line"
        [[ $sha =~ ^[0-9a-f]{40}$ ]] || die "$list: not a full commit id: $sha"
        name=${path#/data/repos/}
        [[ $path == /data/repos/* && $name =~ ^[A-Za-z0-9._-]+$ && $name != . && $name != .. ]] ||
            die "$list: $path is not /data/repos/NAME"
        [[ $seen != *" $name "* ]] || die "$list: $path twice"
        seen+="$name "
        dest=$STAGE/data/repos/$name
        [[ ! -e $dest ]] || die "$list: $path is already part of the data"
        # --no-local: a real clone (a pack, no hard links) even from a mirror path.
        GIT_TERMINAL_PROMPT=0 git "${git_cfg[@]}" clone --quiet --no-local -- "$url" "$dest" ||
            die "cannot clone $url"
        git -C "$dest" "${git_cfg[@]}" checkout --quiet --detach "$sha^{commit}" ||
            die "$url has no commit $sha"
        head=$(git -C "$dest" rev-parse HEAD)
        [[ $head == "$sha" ]] || die "$url: HEAD is $head, not the pinned $sha"
        cloned=$((cloned + 1))
    done <"$list"
fi

chmod -R u+rwX,go+rX,go-w "$STAGE/data"

# `uv sync` in each uv project, as the image's Dockerfile runs it there.
VENVS=$PREFIX/.$BENCH-venv.${STAGE##*.}
BUILD=
trap 'rm -rf "$STAGE" ${BUILD:+"$BUILD"}' EXIT
for rel in "${UV_PROJECTS[@]}"; do
    dest=$STAGE/data/$rel
    # The pins say whether the data must have it (MCP_Atlas's do).
    [[ -f $dest/pyproject.toml ]] || continue
    command -v uv >/dev/null || die "uv is needed to make $rel/.venv as the image does (pip install uv)"
    # A short path, so the scripts' shebangs are direct (#!PATH) as at /data.
    BUILD=$(mktemp -d /tmp/uv-sync.XXXXXX)
    cp "$dest/pyproject.toml" "$BUILD/"
    # Copies, not links into uv's cache: the install owns its files.
    (cd "$BUILD" && UV_LINK_MODE=${UV_LINK_MODE:-copy} uv sync --quiet --python "$PY" \
        ${EXCLUDE_NEWER:+--exclude-newer "$EXCLUDE_NEWER"}) ||
        die "uv sync of $rel failed (its output is above)"
    # The venv's scripts name where it was made; the image's name /data/…,
    # and their packages' RECORD lists their sums and sizes as there.
    python3 - "$BUILD/.venv" "/data/$rel/.venv" <<'PY' || die "cannot move $rel/.venv's scripts to /data/$rel/.venv"
import base64, hashlib, sys
from pathlib import Path

venv, there = Path(sys.argv[1]), sys.argv[2].encode()
here = str(venv).encode()
moved = {}
for f in sorted((venv / "bin").iterdir()):
    if f.is_file() and not f.is_symlink() and here in (data := f.read_bytes()):
        moved[f.name] = data.replace(here, there)
        f.write_bytes(moved[f.name])
for record in venv.glob("lib/python*/site-packages/*.dist-info/RECORD"):
    lines = record.read_bytes().decode().splitlines(keepends=True)
    for i, line in enumerate(lines):
        path = line.split(",", 1)[0]
        data = moved.get(path.removeprefix("../../../bin/")) if path.startswith("../../../bin/") else None
        if data is not None:
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines[i] = f"{path},sha256={digest},{len(data)}" + line[len(line.rstrip("\r\n")):]
    record.write_bytes("".join(lines).encode())
PY
    cp "$BUILD/uv.lock" "$dest/uv.lock"
    full=$STAGE/venv/$rel
    mkdir -p "$(dirname "$full")"
    mv "$BUILD/.venv" "$full"
    rm -rf "$BUILD"
    BUILD=
    # The data's .venv: all of the venv but its packages' directories,
    # which are links to the one read-only copy.
    site=$(cd "$full" && echo lib/python3*/site-packages)
    [[ -d $full/$site ]] || die "uv made no $site in $rel/.venv"
    mkdir "$dest/.venv"
    tar -C "$full" --exclude="./$site/*" -cf - . | tar -C "$dest/.venv" -xpf -
    shopt -s dotglob nullglob
    for e in "$full/$site"/*; do
        n=${e##*/}
        if [[ -d $e && ! -L $e && $n != *.dist-info ]]; then
            ln -s "$VENVS/$rel/$site/$n" "$dest/.venv/$site/$n"
        else
            cp -a "$e" "$dest/.venv/$site/"
        fi
    done
    shopt -u dotglob nullglob
    chmod -R go+rX "$full"
done

if [[ -d $STAGE/venv ]]; then
    mv "$STAGE/venv" "$VENVS"
fi
if [[ -e $PREFIX/$BENCH ]]; then
    mv "$PREFIX/$BENCH" "$STAGE/old"
fi
mv "$STAGE/data" "$PREFIX/$BENCH"
# The packages of the trees replaced.
for old in "$PREFIX/.$BENCH-venv."*; do
    [[ $old == "$VENVS" || ! -d $old ]] || rm -rf "$old"
done
echo "install-benchmark-data: installed $(wc -l <"$PINS") files and $cloned repositories of $BENCH in $PREFIX/$BENCH ($(du -sh "$PREFIX/$BENCH" | cut -f1))"
