#!/usr/bin/env bash
# Copy the iPXE binaries from Debian's `ipxe` package into ipxe/ (the default assets
# directory) so /assets/undionly.kpxe, /assets/ipxe.efi and /assets/snponly.efi are served.
# They are never committed (ipxe/.gitignore). The boot listener also falls back to
# /usr/lib/ipxe for these three names when they are absent from the assets directory.
set -euo pipefail
cd "$(dirname "$0")/.."
src=/usr/lib/ipxe
[[ -d "$src" ]] || { echo "$src missing: apt-get install ipxe" >&2; exit 1; }
for f in undionly.kpxe ipxe.efi snponly.efi; do
  install -m 0644 "$src/$f" "ipxe/$f"
done
ls -l ipxe/*.kpxe ipxe/*.efi
