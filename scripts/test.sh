#!/usr/bin/env bash
# Run bootplane's whole test suite on a fresh Debian bookworm machine.
# Installs the Debian packages the tests need (scripts/test-packages.txt) when missing,
# and the pinned PyPI tools (scripts/test-python.txt) into /opt/bootplane-test-venv,
# then runs every unit, integration and end-to-end test, then every fuzz target for
# FUZZ_SECS seconds each (default 10; 0 skips them; scripts/fuzz.sh, docs/fuzzing.md).
# The tests run under cargo-nextest (.config/nextest.toml): a process per test, every test
# even after a failure; the run still fails, and the failures are listed at the end.
# Arguments go to `cargo nextest run` (e.g. `-E 'test(/^tftp_/)'`; docs/testing.md). Needs root for apt and for the network-namespace tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase's wall time is printed as it ends and again in one line at the end.
phases=()
phase_start=$SECONDS
phase() {
  local took=$((SECONDS - phase_start))
  phases+=("$1 ${took}s")
  echo "phase: $1 took ${took}s"
  phase_start=$SECONDS
}

mapfile -t pkgs < <(grep -v '^\s*#' scripts/test-packages.txt | awk 'NF {print $1}')
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing test packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Daemons installed only as test peers must not start (and grab ports) on install.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
  rm -f /usr/sbin/policy-rc.d
fi

# Python tools from PyPI (scripts/test-python.txt, pinned) in a virtualenv made by Debian's
# python3 (python3-venv) with the system site packages (python3-libvirt); reinstalled only
# when the pinned list changes (its hash is kept in the venv).
venv=/opt/bootplane-test-venv
want=$(sha256sum scripts/test-python.txt | cut -d' ' -f1)
if [[ ! -x $venv/bin/python3 ]] || [[ "$(cat "$venv/.test-python.sha256" 2>/dev/null)" != "$want" ]]; then
  echo "installing test python packages into $venv"
  [[ -x $venv/bin/python3 ]] || /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r scripts/test-python.txt
  echo "$want" > "$venv/.test-python.sha256"
fi

# The test runner. Machines of this project's kind ship cargo-nextest; where it is
# missing, it is built from crates.io (pinned, with its own lock file).
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "installing cargo-nextest from crates.io"
  cargo install --locked cargo-nextest@0.9.143
fi
phase install

# A clean clone gains nothing from incremental compilation, and its caches roughly double the
# target dir (a CI run once failed with "No space left on device" while compiling the tests).
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
df -h . | awk 'NR==2 {print "disk before the build: " $4 " free of " $2}'

# Every step that fails is named at the end; the run goes on to the next step.
failed=()

# The fuzz targets (nightly, cargo-fuzz, their own target dir under fuzz/) are built and
# then run, FUZZ_SECS seconds each, beside the tests' build and run at the lowest priority:
# they take the CPU those leave idle (the build's last crates compile one or two at a
# time, a QEMU boot keeps one core, timers and sockets most of the rest); what is left
# when the tests end runs at full speed. Built at opt-level 1
# (FUZZ_OPT_LEVEL): a cold build in well under half the CPU time of cargo-fuzz's 3. An
# input counts as hung after 60 s (FUZZ_TIMEOUT; 10 s alone): libFuzzer times an input by
# the wall clock, and at nice 19 beside two busy cores a run can wait seconds for a core.
fuzz_secs=${FUZZ_SECS:-10}
fuzz_pid=
fuzz_log=$(mktemp -t bootplane-fuzz.XXXXXX)
trap '[[ -n $fuzz_pid ]] && kill -- -"$fuzz_pid" 2>/dev/null; rm -f "$fuzz_log"' EXIT
if ((fuzz_secs > 0)); then
  set -m  # its own process group, so the trap can stop all of it
  # exit 10: the build failed; 11: a target failed its run.
  FUZZ_OPT_LEVEL=${FUZZ_OPT_LEVEL:-1} FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-60} nice -n 19 bash -c \
    'scripts/fuzz.sh --build-only || exit 10; scripts/fuzz.sh "$1" || exit 11' \
    fuzz "$fuzz_secs" >"$fuzz_log" 2>&1 &
  fuzz_pid=$!
  set +m
fi

# The discovery agent is its own small crate (probe/, built static for the image).
cargo nextest run --locked --no-fail-fast --manifest-path probe/Cargo.toml || failed+=("probe tests")
cargo nextest run --locked --no-run "$@"
phase build

# Every test, each its own process; nextest's summary at its end lists each failure.
# (nextest runs no doctests; the library has none, and tests/it/tidy.rs keeps it so.)
cargo nextest run --locked --no-fail-fast "$@" || failed+=("tests (listed in the summary above)")
phase tests
df -h . | awk 'NR==2 {print "disk after the tests: " $4 " free of " $2}'
du -sh "${CARGO_TARGET_DIR:-target}" 2>/dev/null | awk '{print "target dir: " $1}'
if [[ -n $fuzz_pid ]]; then
  fuzz_rc=0
  wait "$fuzz_pid" || fuzz_rc=$?
  fuzz_pid=
  grep -v '^\s*Compiling ' "$fuzz_log" || true
  case $fuzz_rc in
    0) ;;
    10) failed+=("fuzz build") ;;
    11) failed+=("fuzz runs") ;;
    *) failed+=("fuzz (exit $fuzz_rc)") ;;
  esac
  phase "fuzz build and runs (the rest of them after the tests)"
fi
echo "phases: ${phases[*]} (total ${SECONDS}s)"
if ((${#failed[@]})); then
  echo "scripts/test.sh: FAILED: ${failed[*]}" >&2
  for f in "${failed[@]}"; do echo "  failed: $f" >&2; done
  exit 1
fi
