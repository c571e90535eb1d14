#!/usr/bin/env bash
# Run bootplane's whole test suite on a fresh Debian bookworm machine.
# Installs the Debian packages the tests need (scripts/test-packages.txt) when missing,
# then runs every unit, integration and end-to-end test, then every fuzz target for
# FUZZ_SECS seconds each (default 30; 0 skips them; scripts/fuzz.sh, docs/fuzzing.md).
# Needs root for apt and for the network-namespace tests.
set -euo pipefail
cd "$(dirname "$0")/.."

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

cargo test --locked "$@"
fuzz_secs=${FUZZ_SECS:-30}
if ((fuzz_secs > 0)); then
  exec scripts/fuzz.sh "$fuzz_secs"
fi
