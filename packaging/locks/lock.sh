# shellcheck shell=bash
# `install-servers.sh --lock`: regenerates the locks of packaging/locks/
# from install-servers.sh's table (sourced by it; uses its SERVERS, want,
# npm_key, PYTHON, LOCKS and PIP_JOBS).
#
# npm: one package.json + package-lock.json per prefix (npm/node,
# npm/node@BENCH), each pin added with `npm install --package-lock-only
# --save-exact --before=` the day after its publish time, oldest first, so
# a server meets the dependencies it was built with (or --before=DATE's,
# where the table says so); the table's
# [PARENT>]DEP@VERSION words become package.json overrides (where the registry's
# publish time of a pin is later than its release).
# pip: one hash-locked requirements file per server (py/NAME.txt), what
# pip's resolver picks for the pin and the table's extra requirements and
# flags (--uploaded-prior-to for a benchmark's pins), from pip's install
# report (pip install --dry-run --report): name==version and the sha256 of
# the very file chosen.

# pip 25.3 and later know --uploaded-prior-to.
LOCK_PIP=pip==26.3

# The day after `name@version` was published, from the registry.
npm_release_next_day() {
    local pkg=$1
    npm view "${pkg%@*}" time --json | node -e '
        const t = JSON.parse(require("fs").readFileSync(0, "utf8"))[process.argv[1]];
        if (!t) { console.error("no release time for " + process.argv[1]); process.exit(1); }
        const d = new Date(t); d.setUTCDate(d.getUTCDate() + 1); console.log(d.toISOString());
    ' "${pkg##*@}"
}

lock_npm() {
    local key=$1 work=$2 d=$2/npm/$1 line name kind pkg flags date w
    local dated=() overrides=()
    mkdir -p "$d"
    for line in "${SERVERS[@]}"; do
        IFS='|' read -r name kind pkg flags <<<"$line"
        [[ $kind == npm && $(npm_key "$name") == "$key" ]] || continue
        date=$(npm_release_next_day "$pkg") || die "$name: cannot read the release date of $pkg"
        for w in $flags; do
            # --before=DATE: its dependencies as of DATE instead (where
            # those of its release day cannot be installed).
            if [[ $w == --before=* ]]; then date=${w#--before=}; else overrides+=("$w"); fi
        done
        dated+=("$date $pkg")
    done
    # package.json: private, with the table's overrides (DEP@VERSION).
    node -e '
        const o = {};
        for (const w of process.argv.slice(1)) {
            const [parent, dep] = w.includes(">") ? w.split(">") : [null, w];
            const i = dep.lastIndexOf("@"), name = dep.slice(0, i), v = dep.slice(i + 1);
            if (parent) (o[parent] ||= { ".": "$" + parent })[name] = v; else o[name] = v;
        }
        const p = { private: true };
        if (Object.keys(o).length) p.overrides = o;
        console.log(JSON.stringify(p, null, 2));
    ' "${overrides[@]}" >"$d/package.json"
    while read -r date pkg; do
        echo "install-servers: lock $key: $pkg (dependencies before $date)"
        npm install --prefix "$d" --package-lock-only --save-exact --no-audit --no-fund \
            --loglevel=error --before="$date" "$pkg" || die "$key: cannot lock $pkg"
    done < <(printf '%s\n' "${dated[@]}" | sort)
    mkdir -p "$LOCKS/npm/$key"
    cp "$d/package.json" "$d/package-lock.json" "$LOCKS/npm/$key/"
}

lock_pip() {
    local name=$1 pkg=$2 flags=$3 work=$4
    echo "install-servers: lock $name: $pkg $flags"
    # shellcheck disable=SC2086
    PIP_FIND_LINKS='' "$work/venv/bin/pip" install --dry-run --ignore-installed --quiet \
        --disable-pip-version-check --report "$work/$name.json" "$pkg" $flags \
        || die "$name: pip cannot resolve $pkg $flags"
    "$work/venv/bin/python" "$LOCKS/pylock.py" from-report "$work/$name.json" "$name: $pkg $flags" \
        >"$work/$name.txt" || die "$name: cannot lock $pkg"
    mv "$work/$name.txt" "$LOCKS/py/$name.txt"
}

lock_all() {
    local work line name kind pkg flags key pids=()
    declare -A keys=()
    work=$(mktemp -d)
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" EXIT
    mkdir -p "$LOCKS/py" "$LOCKS/npm"
    "$PYTHON" -m venv "$work/venv"
    PIP_FIND_LINKS='' "$work/venv/bin/pip" install --quiet --disable-pip-version-check "$LOCK_PIP"
    for line in "${SERVERS[@]}"; do
        IFS='|' read -r name kind pkg flags <<<"$line"
        want "$name" || continue
        case $kind in
        npm) keys[$(npm_key "$name")]=1 ;;
        pip)
            if [[ ${#pids[@]} -ge $PIP_JOBS ]]; then
                wait "${pids[0]}"
                pids=("${pids[@]:1}")
            fi
            lock_pip "$name" "$pkg" "$flags" "$work" &
            pids+=($!)
            ;;
        esac
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
    for key in "${!keys[@]}"; do lock_npm "$key" "$work"; done
    echo "install-servers: locks written to $LOCKS"
}
