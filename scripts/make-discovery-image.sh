#!/usr/bin/env bash
# Build bootplane's discovery image: scripts/make-discovery-image.sh OUT_DIR
#
# Writes OUT_DIR/vmlinuz (Debian's kernel), OUT_DIR/initramfs.img (a newc cpio: static
# busybox, the static `bootplane probe` agent as /bin/bootplane, the kernel modules for
# common NICs and disks (dependencies from each module's .modinfo), and /init) and OUT_DIR/catalog-entry.toml (an [[image]] stanza
# for images/catalog.toml, ref `bootplane-discovery:latest`, paths under
# `bootplane-discovery/`: copy OUT_DIR to images/bootplane-discovery/ or build into it).
#
# Downloads (apt-get download, never installed) are cached in CACHE_DIR (default
# OUT_DIR/cache); running it again reuses them and rewrites the outputs. Fails loudly:
# any missing tool, download, module or a non-static agent stops it.
#
# Environment: CACHE_DIR, KERNEL_PACKAGE (default: what linux-image-amd64 depends on),
# EXTRA_MODULES (space-separated module names added to the default set).
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 OUT_DIR" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
cache=${CACHE_DIR:-$out/cache}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

die() { echo "make-discovery-image: error: $*" >&2; exit 1; }
for t in cargo apt-get apt-cache dpkg-deb python3 file ldd sha256sum; do
  command -v "$t" >/dev/null || die "$t is not installed"
done

# Modules for common NICs and disks (their dependencies come from each .modinfo), the
# packet socket LLDP listens on when the kernel has it as a module, and the file systems
# `bootplane probe install` writes the Ignition config into (ext4 with the crc32c it asks
# the crypto API for, which no `depends=` names; vfat with Debian's default codepage 437
# and iocharset ascii; docs/install.md).
modules="e1000 e1000e igb ixgbe virtio_net virtio_pci virtio_blk virtio_scsi sd_mod nvme ahci af_packet crc32c_generic ext4 vfat nls_cp437 nls_ascii ${EXTRA_MODULES:-}"

# --- the agent, static ----------------------------------------------------------------
echo "make-discovery-image: building the static agent"
RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --offline --quiet \
  --manifest-path "$repo/probe/Cargo.toml" --target x86_64-unknown-linux-gnu \
  --target-dir "$repo/probe/target"
agent=$repo/probe/target/x86_64-unknown-linux-gnu/release/bootplane-probe
[[ -x $agent ]] || die "no agent binary at $agent"
file -L "$agent" | grep -Eq 'statically linked|static-pie linked' || die "the agent is not static: $(file -L "$agent")"
if ldd "$agent" 2>&1 | grep -q '=>'; then die "the agent links shared libraries: $(ldd "$agent")"; fi

# --- Debian packages, downloaded once ---------------------------------------------------
fetch_deb() { # fetch_deb PACKAGE -> path of the .deb in the cache
  local pkg=$1 deb
  deb=$(find "$cache" -maxdepth 1 -name "${pkg}_*_amd64.deb" | head -n1)
  if [[ -z $deb ]]; then
    echo "make-discovery-image: apt-get download $pkg" >&2
    (cd "$cache" && apt-get download "$pkg" >&2) || die "apt-get download $pkg failed"
    deb=$(find "$cache" -maxdepth 1 -name "${pkg}_*_amd64.deb" | head -n1)
    [[ -n $deb ]] || die "apt-get download $pkg left no .deb in $cache"
  fi
  echo "$deb"
}
unpack() { # unpack DEB DIR (once)
  if [[ ! -d $2 ]]; then
    rm -rf "$2.tmp"
    dpkg-deb -x "$1" "$2.tmp" || die "dpkg-deb -x $1 failed"
    mv "$2.tmp" "$2"
  fi
}

kpkg=${KERNEL_PACKAGE:-$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: //p' | head -n1)}
[[ $kpkg == linux-image-* ]] || die "cannot tell the kernel package (apt-cache depends linux-image-amd64 said: ${kpkg:-nothing})"
kdeb=$(fetch_deb "$kpkg")
kroot=$cache/root-$(basename "$kdeb" .deb)
unpack "$kdeb" "$kroot"
# busybox-static conflicts with the installed busybox package: downloaded, never installed.
bdeb=$(fetch_deb busybox-static)
broot=$cache/root-$(basename "$bdeb" .deb)
unpack "$bdeb" "$broot"

vmlinuz=$(find "$kroot/boot" -maxdepth 1 -name 'vmlinuz-*' | head -n1)
[[ -n $vmlinuz ]] || die "no vmlinuz in $kdeb"
kver=${vmlinuz##*/vmlinuz-}
moddir=$kroot/lib/modules/$kver
[[ -d $moddir/kernel ]] || die "no modules in $moddir"
busybox=$broot/bin/busybox
file -L "$busybox" | grep -q 'statically linked' || die "busybox from busybox-static is not static"

# --- the initramfs ------------------------------------------------------------------------
echo "make-discovery-image: packing the initramfs ($kver)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$moddir" "$busybox" "$agent" "$repo/scripts/discovery-init.sh" "$tmp/initramfs.img" $modules <<'PY'
"""Resolve the modules' dependencies and write the newc cpio."""
import lzma, os, re, sys

moddir, busybox, agent, init, out, *wanted = sys.argv[1:]

def norm(name):
    base = os.path.basename(name)
    for ext in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
        if base.endswith(ext):
            base = base[: -len(ext)]
    return base.replace("-", "_")

# Debian's package has no modules.dep (depmod writes it at install time): every module's
# dependencies are read from its own .modinfo (`depends=`), only for the modules needed.
paths = {}
for dirpath, _, files in os.walk(os.path.join(moddir, "kernel")):
    for f in files:
        if ".ko" in f:
            paths[norm(f)] = os.path.relpath(os.path.join(dirpath, f), moddir)

def raw_module(path):
    data = open(os.path.join(moddir, path), "rb").read()
    if path.endswith(".xz"):
        return lzma.decompress(data)
    if path.endswith(".zst") or path.endswith(".gz"):
        sys.exit(f"make-discovery-image: error: cannot unpack {path} (only .ko and .ko.xz)")
    return data

class Deps(dict):
    def __missing__(self, name):
        m = re.search(rb"(?:^|\0)depends=([^\0]*)\0", raw_module(paths[name]))
        ds = [d for d in (m.group(1).decode().split(",") if m else []) if d]
        self[name] = (paths[name], ds)
        return self[name]
deps = Deps()
builtin = set()
bi = os.path.join(moddir, "modules.builtin")
if os.path.exists(bi):
    builtin = {norm(l.strip()) for l in open(bi) if l.strip()}

order, seen = [], set()
def load(name, stack=()):
    if name in seen:
        return
    if name in stack:
        sys.exit(f"make-discovery-image: error: module dependency cycle at {name}")
    path, ds = deps[name]
    for d in ds:
        load(norm(d), stack + (name,))
    seen.add(name)
    order.append(path)
for m in wanted:
    m = norm(m)
    if m in paths:
        load(m)
    elif m in builtin:
        print(f"make-discovery-image: {m} is built into the kernel", file=sys.stderr)
    else:
        sys.exit(f"make-discovery-image: error: module {m} is neither in the package nor built in")

entries, ino = [], [1]
def add(name, mode, data=b"", rdev=(0, 0)):
    entries.append((name, mode, data, rdev))
for d in ["bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "proc", "sys", "run", "tmp", "etc", "lib", "lib/modules", "var", "var/run"]:
    add(d, 0o040755)
add("dev/console", 0o020600, rdev=(5, 1))
add("dev/null", 0o020666, rdev=(1, 3))
add("bin/busybox", 0o100755, open(busybox, "rb").read())
add("bin/sh", 0o120777, b"busybox")
add("bin/bootplane", 0o100755, open(agent, "rb").read())
add("init", 0o100755, open(init, "rb").read())
names = []
for p in order:
    n = norm(p) + ".ko"
    add("lib/modules/" + n, 0o100644, raw_module(p))
    names.append(n)
add("etc/modules.order", 0o100644, ("\n".join(names) + "\n").encode())

out_b = bytearray()
def pad():
    while len(out_b) % 4:
        out_b.append(0)
def header(name, mode, size, rdev, ino):
    fields = [ino, mode, 0, 0, 2 if mode & 0o170000 == 0o040000 else 1, 0, size, 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
    out_b.extend(b"070701" + b"".join(b"%08x" % v for v in fields))
    out_b.extend(name.encode() + b"\0")
    pad()
for i, (name, mode, data, rdev) in enumerate(entries, start=1):
    header(name, mode, len(data), rdev, i)
    out_b.extend(data)
    pad()
header("TRAILER!!!", 0, 0, (0, 0), 0)
with open(out, "wb") as f:
    f.write(out_b)
print(f"make-discovery-image: {len(names)} modules: {' '.join(names)}", file=sys.stderr)
PY

# --- outputs, replaced atomically -----------------------------------------------------------
cp "$vmlinuz" "$tmp/vmlinuz"
for f in vmlinuz initramfs.img; do mv -f "$tmp/$f" "$out/$f"; done
ksum=$(sha256sum "$out/vmlinuz" | cut -d' ' -f1)
isum=$(sha256sum "$out/initramfs.img" | cut -d' ' -f1)
cat >"$out/catalog-entry.toml.tmp" <<EOF
# bootplane's discovery image (scripts/make-discovery-image.sh; kernel $kpkg).
# bootplane appends bootplane.inventory=<signed url> when it boots a machine into it.
[[image]]
ref = "bootplane-discovery:latest"
arch = "amd64"
cmdline = "console=ttyS0 panic=-1"
kernel = { path = "bootplane-discovery/vmlinuz", sha256 = "$ksum" }
initrd = { path = "bootplane-discovery/initramfs.img", sha256 = "$isum" }
EOF
mv -f "$out/catalog-entry.toml.tmp" "$out/catalog-entry.toml"
echo "make-discovery-image: wrote $out/vmlinuz $out/initramfs.img $out/catalog-entry.toml"
