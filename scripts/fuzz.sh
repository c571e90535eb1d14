#!/usr/bin/env bash
# Run every cargo-fuzz target for a bounded time: scripts/fuzz.sh [SECONDS] [TARGET...]
# (`scripts/fuzz.sh --build-only` installs what is missing, builds every target and stops:
# scripts/test.sh runs that beside the tests.)
#
# Builds all targets once (nightly + cargo-fuzz, installed when missing), then runs each
# for SECONDS (default 30) from a temporary copy of its seed corpus (fuzz/seeds/<target>/;
# the generated corpus is thrown away, never committed), FUZZ_JOBS targets at a time
# (default: one per core). Prints runs, runs/s and crashes per target and a last line
# `N passed, N failed`; exits non-zero when any target crashed, leaked, timed out or
# failed to start. Crash inputs are kept in fuzz/artifacts/<target>/ (reproduce with
# `fuzz/target/<triple>/release/<target> fuzz/artifacts/<target>/crash-...`).
#
# Environment: FUZZ_JOBS (parallel targets), FUZZ_RSS_MB (per-target memory limit,
# default 2048), FUZZ_TIMEOUT (seconds one input may take, default 10),
# FUZZ_SANITIZER (cargo fuzz -s: none (default), address, ...), FUZZ_CGU (codegen units
# per crate, default 16: a cold build takes minutes less on two cores than cargo-fuzz's
# default of 1, for somewhat fewer runs per second; set 1 for long runs), FUZZ_OPT_LEVEL
# (the targets' opt-level, default cargo-fuzz's 3; scripts/test.sh builds with 1: a cold
# build in well under half the CPU time, for fewer runs per second in its 20-s smoke runs).
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=0
if [[ ${1:-} == --build-only ]]; then
  build_only=1
  shift
fi
secs=${1:-30}
shift || true
[[ $secs =~ ^[0-9]+$ && $secs -gt 0 ]] || { echo "usage: $0 [SECONDS] [TARGET...]" >&2; exit 2; }
rss_mb=${FUZZ_RSS_MB:-2048}
per_input=${FUZZ_TIMEOUT:-10}
sanitizer=${FUZZ_SANITIZER:-none}
jobs=${FUZZ_JOBS:-$(nproc)}
cgu=${FUZZ_CGU:-16}
# cargo-fuzz builds the release profile; cargo reads its opt-level from the environment.
if [[ -n ${FUZZ_OPT_LEVEL:-} ]]; then
  [[ $FUZZ_OPT_LEVEL =~ ^[0-3]$ ]] || { echo "fuzz: FUZZ_OPT_LEVEL must be 0-3" >&2; exit 2; }
  export CARGO_PROFILE_RELEASE_OPT_LEVEL=$FUZZ_OPT_LEVEL
fi

# --- toolchain --------------------------------------------------------------------
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz: installing the nightly toolchain (cargo-fuzz needs it)"
  rustup toolchain install nightly --profile minimal || {
    echo "fuzz: error: no nightly toolchain and 'rustup toolchain install nightly' failed;" \
      "install it (rustup toolchain install nightly --profile minimal) and rerun" >&2
    exit 2
  }
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install cargo-fuzz --locked || {
    echo "fuzz: error: cargo-fuzz is missing and 'cargo install cargo-fuzz --locked' failed" >&2
    exit 2
  }
fi

mapfile -t all < <(cargo fuzz list)
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")
for t in "${targets[@]}"; do
  printf '%s\n' "${all[@]}" | grep -qx "$t" || { echo "fuzz: unknown target $t" >&2; exit 2; }
done

# --- build once -------------------------------------------------------------------
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
build_start=$SECONDS
cargo +nightly fuzz build -s "$sanitizer" --debug-assertions --codegen-units "$cgu"
echo "fuzz: built ${#all[@]} targets in $((SECONDS - build_start)) s"
((build_only == 0)) || exit 0
bindir=fuzz/target/$triple/release

# --- run --------------------------------------------------------------------------
work=$(mktemp -d -t bootplane-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p fuzz/artifacts

run_one() {
  local t=$1 corpus=$work/$1/corpus log=$work/$1/log
  mkdir -p "$corpus" "fuzz/artifacts/$t"
  if [[ -d fuzz/seeds/$t ]]; then cp -r "fuzz/seeds/$t/." "$corpus/"; fi
  local extra=()
  case $t in
    image_format) extra=(-max_len=65536) ;;
    butane | ignition_validate | api_body) extra=(-max_len=16384) ;;
  esac
  local rc=0
  # TMPDIR: targets that need files (image_format, the HTTP ones) keep them here.
  TMPDIR=$work/$t "$bindir/$t" "$corpus" \
    -max_total_time="$secs" -rss_limit_mb="$rss_mb" -timeout="$per_input" \
    -artifact_prefix="fuzz/artifacts/$t/" -print_final_stats=1 "${extra[@]}" \
    >"$log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t/rc"
}

touch "$work/.start"
run_start=$SECONDS
running=0
for t in "${targets[@]}"; do
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
  run_one "$t" &
  running=$((running + 1))
done
wait || true

passed=0
failed=0
printf '%-20s %12s %10s %8s  %s\n' target runs runs/s crashes result
for t in "${targets[@]}"; do
  log=$work/$t/log
  rc=$(cat "$work/$t/rc" 2>/dev/null || echo 1)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  runs=${runs:-0}
  took=${took:-$secs}
  ((took > 0)) || took=1
  crashes=$(find "fuzz/artifacts/$t" -newer "$work/.start" -type f 2>/dev/null | wc -l)
  if ((rc == 0 && crashes == 0)); then
    result=ok
    passed=$((passed + 1))
  else
    result="FAILED (exit $rc)"
    failed=$((failed + 1))
    echo "---- $t: last lines of its log" >&2
    tail -n 40 "$log" >&2
  fi
  printf '%-20s %12s %10s %8s  %s\n' "$t" "$runs" "$((runs / took))" "$crashes" "$result"
done
echo "fuzz: ran ${#targets[@]} targets x ${secs} s in $((SECONDS - run_start)) s ($jobs at a time)"
echo "$passed passed, $failed failed"
((failed == 0))
