#!/usr/bin/env bash
# Build the demo image `os-image:latest` listed in images/catalog.toml.
#
# Default: two small deterministic placeholder files (a "kernel" and an "initrd") whose
# SHA-256 is committed in images/catalog.toml, so the reference samples resolve to
# Ready and the boot chain can be followed end to end by HTTP clients.
#
# --host-kernel: copy the host's newest /boot/vmlinuz-* (and initrd.img-* when present)
# instead, and rewrite the digests in images/catalog.toml accordingly (a real kernel
# for QEMU boots; do not commit that catalog change).
set -eu
cd "$(dirname "$0")/.."
dir=images/os-image
mkdir -p "$dir"
yes 'bootplane demo kernel placeholder' | head -c 65536 > "$dir/vmlinuz"
yes 'bootplane demo initrd placeholder' | head -c 131072 > "$dir/initrd.img"
if [[ "${1:-}" == "--host-kernel" ]]; then
  k=$(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n1 || true)
  [[ -n "$k" && -r "$k" ]] || { echo "no readable /boot/vmlinuz-* on this host" >&2; exit 1; }
  cp "$k" "$dir/vmlinuz"
  i="/boot/initrd.img-${k#/boot/vmlinuz-}"
  [[ -r "$i" ]] && cp "$i" "$dir/initrd.img"
  ks=$(sha256sum "$dir/vmlinuz" | cut -d' ' -f1)
  is=$(sha256sum "$dir/initrd.img" | cut -d' ' -f1)
  sed -i -E "/os-image\/vmlinuz/ s/sha256 = \"[0-9a-f]{64}\"/sha256 = \"$ks\"/; /os-image\/initrd.img/ s/sha256 = \"[0-9a-f]{64}\"/sha256 = \"$is\"/" images/catalog.toml
fi
sha256sum "$dir/vmlinuz" "$dir/initrd.img"
