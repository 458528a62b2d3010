# Shared by .ci/test-all.sh and .ci/quick.sh (sourced): the debug build's
# environment, the step clock, and the slow-test report.

export PATH="$HOME/.cargo/bin:$PATH"

# One debug build serves clippy and the tests: clippy's driver compiles the
# workspace's own crates (linting them, then generating code as rustc
# does), plain rustc the dependencies. The same environment for every
# debug cargo command, or cargo rebuilds the workspace's crates.
# CLIPPY_ARGS is how `cargo clippy -- -D warnings` hands its arguments
# to the driver.
lint_env() {
  RUSTC_WORKSPACE_WRAPPER=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver)
  export RUSTC_WORKSPACE_WRAPPER
  export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
}

# The CPU time (user + system, in clock ticks) of this shell and of the
# children it has waited for.
cpu_ticks() {
  local s
  read -r s < /proc/$$/stat
  s=${s##*) }
  # shellcheck disable=SC2086
  set -- $s
  echo $((${12} + ${13} + ${14} + ${15}))
}
TICKS=$(getconf CLK_TCK)
# The machine's busy time (user, nice, system, irq, softirq: every core,
# every process, in clock ticks). With nothing else running it is the
# run's, including what no parent waited for (the slots' processes); the
# step table shows it as cores busy on average.
busy_ticks() {
  local _cpu u n s _idle _io irq soft _rest
  read -r _cpu u n s _idle _io irq soft _rest < /proc/stat
  echo $((u + n + s + irq + soft))
}
RUN_B0=$(busy_ticks)
# busy_cores TICKS SECONDS: the cores busy on average, e.g. 1.87.
busy_cores() {
  local t=$1 w=$2
  [ "$w" -gt 0 ] || w=1
  printf '%d.%02d' $((t / TICKS / w)) $((t * 100 / TICKS / w % 100))
}
mmss() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }

# step NAME: starts a step (ending the one before) and says when, in
# minutes:seconds since the start; `steps_report` prints each step's wall
# and CPU time.
STEP_ROWS=()
STEP_NAME=""
step() {
  step_end
  STEP_NAME="$*"
  STEP_T0=$SECONDS
  STEP_C0=$(cpu_ticks)
  STEP_B0=$(busy_ticks)
  printf '\n==> [%s] %s\n' "$(mmss $SECONDS)" "$*"
}
step_end() {
  [ -n "$STEP_NAME" ] || return 0
  local cpu=$((($(cpu_ticks) - STEP_C0) / TICKS)) wall=$((SECONDS - STEP_T0))
  local busy
  busy=$(busy_cores $(($(busy_ticks) - STEP_B0)) "$wall")
  STEP_ROWS+=("$(printf '| %s | %s | %s | %s |' "$STEP_NAME" "$(mmss "$wall")" "$(mmss $cpu)" "$busy")")
  STEP_NAME=""
}
# A job run beside the steps (`background NAME LOG cmd…`, then
# `background_wait NAME`): its own wall and CPU time, as a row of its own.
background() {
  local name=$1 log=$2
  shift 2
  /usr/bin/time -f "%e %U %S" -o "target/ci-times/$name" "$@" > "$log" 2>&1 &
  eval "BG_${name//-/_}=$!"
}
background_wait() {
  local name=$1 log=$2 pid
  eval "pid=\$BG_${name//-/_}"
  if ! wait "$pid"; then
    cat "$log" >&2
    echo "$name failed (its log: $log)" >&2
    return 1
  fi
  local wall user sys
  read -r wall user sys < "target/ci-times/$name"
  STEP_ROWS+=("$(printf '| (beside) %s | %s | %s | |' "$name" "$(mmss "${wall%.*}")" "$(mmss $(( ${user%.*} + ${sys%.*} )))")")
}
# Ends the jobs still running beside the steps, with everything they
# started (a failed step must not leave a build, VMs or benches running).
# Never fails: it runs from the EXIT trap.
end_background() {
  local p
  for p in $(jobs -p); do
    kill_tree "$p"
  done
}
kill_tree() {
  local c
  for c in $(pgrep -P "$1" 2>/dev/null); do
    kill_tree "$c"
  done
  kill "$1" 2>/dev/null || true
}
steps_report() {
  step_end
  echo
  echo "| step | wall | CPU (user + system, of the processes waited for) | machine busy (cores, of $(nproc)) |"
  echo "|---|---|---|---|"
  printf '%s\n' "${STEP_ROWS[@]}"
  echo "| all | $(mmss $SECONDS) | $(mmss $(($(cpu_ticks) / TICKS))) | $(busy_cores $(($(busy_ticks) - RUN_B0)) $SECONDS) |"
}

# The test harness's arguments. Four tests at a time in each test binary:
# they fill the cores the tests' sleeps and waits leave idle (tests/host
# 331 -> 222 s alone, the whole run 17:39-18:04). Under that load
# bubblewrap once failed a slot's loopback setup ("Failed RTM_NEWADDR");
# the host now starts such a slot again (pool::start). And the tests' own clock:
# libtest's --report-time, an unstable option of the harness, allowed by
# RUSTC_BOOTSTRAP in the test processes only (cargo's runner,
# .ci/test-runner; the builds never see it). Doc tests are run by
# rustdoc, not the runner: they run without it (`cargo test --doc`).
# `slow_tests LOG…` prints the 20 slowest.
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/.ci/test-runner"
TEST_ARGS=(--test-threads=4 -Z unstable-options --report-time)
slow_tests() {
  echo
  echo "The 20 slowest tests (libtest's --report-time):"
  awk '/^ *Running / { suite = $2 }
       /^test .* \.\.\. (ok|FAILED) <[0-9.]+s>$/ {
         t = $NF; gsub(/[<>s]/, "", t); printf "%9.3f s  %s  %s\n", t, suite, $2 }' "$@" \
    | sort -rn | head -20
}

# The static build of the test command's short mode (test-all.sh says why;
# packaging/build-static.sh applies it). The VM tests' image scripts build
# through that script too, and inherit it, so they find that build done
# (quick.sh sets it too).
light_static_env() {
  export SANDBOX_STATIC_PROFILE=light
}
