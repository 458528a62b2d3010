#!/usr/bin/env bash
# The author's fast loop: formatting, clippy and the tests of the crates a
# change touches, on a warm tree, in a few minutes (docs/testing.md).
#
#   .ci/quick.sh                  the packages changed since origin/main
#                                 (or main), committed or not
#   .ci/quick.sh host agent       these suites of sandbox-suite (tests/NAME)
#                                 and/or packages by directory (src/NAME)
#   .ci/quick.sh host -- FILTER   …with a test-name filter
#
# It builds as the test command does (the same debug build, clippy as the
# compiler's wrapper, the kubernetes backend on), so the next full run
# reuses it. The full check before a push stays ./.ci/test-all.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
. .ci/lib.sh
lint_env
light_static_env

case "${1:-}" in -h | --help) sed -n '2,14p' "$0"; exit 0 ;; esac

args=() filter=()
while [ $# -gt 0 ]; do
  if [ "$1" = -- ]; then
    shift
    filter=("$@")
    break
  fi
  args+=("$1")
  shift
done

# What changed: a path under src/NAME names its package (src/agent and
# src/host: their suites, which test them), tests/NAME its suite;
# tests/common, tests/clients and packaging/ touch the agent's and the
# host's suites. benches/ only needs the build.
if [ ${#args[@]} -eq 0 ]; then
  base=$(git merge-base HEAD origin/main 2>/dev/null || git merge-base HEAD main 2>/dev/null || echo HEAD)
  mapfile -t changed < <({ git diff --name-only "$base"; git ls-files --others --exclude-standard; } | sort -u)
  for f in "${changed[@]}"; do
    case $f in
      src/*/*) args+=("$(cut -d/ -f2 <<< "$f")") ;;
      tests/agent/* | tests/host/* | tests/vm/*) args+=("$(cut -d/ -f2 <<< "$f")") ;;
      tests/common/* | tests/clients/* | packaging/*) args+=(agent host) ;;
    esac
  done
  mapfile -t args < <(printf '%s\n' "${args[@]}" | sort -u)
  if [ ${#args[@]} -eq 0 ]; then
    echo "quick: nothing changed since $base that a test covers; name suites or packages (see --help)" >&2
    exit 0
  fi
fi

# Cargo target flags, always over the whole workspace: a narrower package
# selection resolves features differently and rebuilds dependencies.
targets=()
for a in "${args[@]}"; do
  case $a in
    agent | host | vm) targets+=(--test "$a") ;;
    *)
      [ -f "src/$a/Cargo.toml" ] || { echo "quick: no suite tests/$a and no package src/$a" >&2; exit 2; }
      # Every package's unit tests (seconds), and this one's own test files.
      targets+=(--lib --bins)
      for t in src/"$a"/tests/*.rs; do
        [ -e "$t" ] && targets+=(--test "$(basename "$t" .rs)")
      done
      ;;
  esac
done
echo "quick: ${args[*]}"

step "cargo fmt --check"
cargo fmt --all --check
step "debug build, linted (every workspace target)"
cargo test --locked --workspace --features kubernetes --all-targets --no-run
step "tests: ${args[*]}"
cargo test --locked --workspace --features kubernetes "${targets[@]}" -- "${TEST_ARGS[@]}" "${filter[@]}" 2>&1 \
  | tee target/quick-tests.log
step_end
steps_report
slow_tests target/quick-tests.log
