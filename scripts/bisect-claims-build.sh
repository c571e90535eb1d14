#!/usr/bin/env bash
# Build the claims bench at several commits for scripts/bench-builds.sh, each with its own
# copy of the appliance it starts.
#
#   scripts/bisect-claims-build.sh SRC OUT SPEC...
#   scripts/bisect-claims-build.sh --pair OUT BENCH_LABEL APPLIANCE_LABEL
#
# SRC: a git worktree of this repository that this script may check out freely (not the one
# it runs from: bash reads a script while it runs, and a checkout would change it underfoot);
# e.g. `git worktree add --detach /var/tmp/bisect-src HEAD`. It is left detached at the last
# SPEC's commit, with no local changes.
# OUT: where the binaries go. For each SPEC it writes OUT/LABEL-claims (the bench),
# OUT/a/LABEL (the bootplane binary built with it), OUT/cwd/LABEL (that commit's images/ and
# ipxe/: the appliance reads ./images/catalog.toml and ./ipxe, and `cargo bench` runs in the
# checkout, so run each bench from its cwd dir) and OUT/LABEL.txt (commit, build time,
# checksums).
# SPEC: COMMIT or COMMIT:events-switch. LABEL is the short commit, plus "-evsw" for the
# second form, which applies a bisection-only patch before the build: the Events recorder's
# record() drops every Event before its queue when the appliance runs with
# BOOTPLANE_BISECT_EVENTS=off (the bench passes its environment on to the appliance), so one
# binary measures Events on and off. The patch is never committed; SRC is reset after.
#
# Each build is `nice -n 10 cargo bench --bench claims --no-run` in SRC with
# CARGO_TARGET_DIR (default /work/bisect-target: one target dir for every commit keeps the
# dependencies' builds shared).
#
# Why a copy of the appliance: the bench starts env!("CARGO_BIN_EXE_bootplane"), an absolute
# path into the target dir compiled into the bench, and the next commit's build overwrites
# that file. So the copy's embedded path is rewritten (same length, padded with '/') to
# OUT/a/LABEL; the build fails if OUT is too long for that. Check with
# `strings OUT/LABEL-claims | grep /a/LABEL`.
#
# --pair (no build): OUT/APPLIANCE_LABEL+BENCH_LABEL-claims, the bench built as BENCH_LABEL
# starting OUT/a/APPLIANCE_LABEL. For a commit whose own bench differs from a later one in
# the client only, e.g. c7acecf's bench sent its JSON without a Content-Type, so the server
# parsed it with the YAML parser (d5e06c6): `--pair OUT fbaf192 c7acecf` runs fbaf192's
# client against c7acecf. The labels must have the same length.
set -euo pipefail
if [[ ${1:-} == --pair ]]; then
  out=$2 bl=$3 al=$4
  (( ${#bl} == ${#al} )) || { echo "--pair: labels of different lengths" >&2; exit 2; }
  [[ -x $out/a/$al ]] || { echo "no $out/a/$al" >&2; exit 1; }
  python3 - "$out" "$bl" "$al" <<'EOF'
import os, re, sys
out, bl, al = sys.argv[1:]
src, dst = f"{out}/{bl}-claims", f"{out}/{al}+{bl}-claims"
data = open(src, "rb").read()
pat = re.escape(out.encode()) + rb"/a/+" + re.escape(bl.encode())
n = len(re.findall(pat, data))
if n == 0:
    sys.exit(f"{src} names no {out}/a/{bl}")
data = re.sub(pat, lambda m: m.group(0)[: -len(bl)] + al.encode(), data)
open(dst, "wb").write(data)
os.chmod(dst, 0o755)
print(f"{dst}: {n} reference(s) to the appliance now {out}/a/{al}")
EOF
  exit 0
fi
src=$1 out=$2
shift 2
target=${CARGO_TARGET_DIR:-/work/bisect-target}
export CARGO_TARGET_DIR=$target
mkdir -p "$out/a" "$out/logs"
events_patch() { # add the BOOTPLANE_BISECT_EVENTS=off switch to record()
  local f
  for f in crates/store/src/events.rs src/store/events.rs; do
    [[ -f $src/$f ]] || continue
    python3 - "$src/$f" <<'EOF'
import re, sys
p = sys.argv[1]
s = open(p).read()
m = re.search(r"\n(    pub(?:\(crate\))? fn record\(&self[^\n]*\{\n)", s)
if not m:
    sys.exit(f"{p}: no record(&self, ...) to patch")
guard = ("        if bisect_events_off() {\n            return;\n        }\n")
s = s[:m.end()] + guard + s[m.end():]
s += '''
/// Bisection only (scripts/bisect-claims-build.sh, never committed): with
/// BOOTPLANE_BISECT_EVENTS=off every Event is dropped before the recorder's queue.
fn bisect_events_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("BOOTPLANE_BISECT_EVENTS").is_ok_and(|v| v == "off"))
}
'''
open(p, "w").write(s)
EOF
    return 0
  done
  echo "no events.rs at this commit: no Events to switch off" >&2
  return 1
}
for spec in "$@"; do
  commit=${spec%%:*} variant=
  [[ $spec == *:* ]] && variant=${spec#*:}
  short=$(git -C "$src" rev-parse --short=7 "$commit^{commit}")
  label=$short
  git -C "$src" checkout -q --detach "$short"
  case $variant in
    "") ;;
    events-switch) events_patch; label=$short-evsw ;;
    *) echo "unknown variant $variant in $spec" >&2; exit 2 ;;
  esac
  log=$out/logs/build-$label.log
  echo "=== $label ($(git -C "$src" log -1 --format='%h %ad %s' --date=short | cut -c1-100))"
  t0=$(date +%s)
  if ! (cd "$src" && nice -n 10 cargo bench --bench claims --no-run --message-format=json-render-diagnostics) \
    >"$log.json" 2>"$log"; then
    echo "build of $label failed:" >&2
    tail -20 "$log" >&2
    git -C "$src" checkout -q -- .
    exit 1
  fi
  t1=$(date +%s)
  git -C "$src" checkout -q -- .
  rm -rf "$out/cwd/$label" && mkdir -p "$out/cwd/$label"
  git -C "$src" archive HEAD images ipxe | tar -x -C "$out/cwd/$label"
  bench=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    try: m = json.loads(l)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "claims":
        print(m["executable"])' "$log.json" | tail -1)
  [[ -n $bench ]] || { echo "no claims executable in $log.json" >&2; exit 1; }
  appliance=$target/release/bootplane
  cp "$appliance" "$out/a/$label"
  python3 - "$bench" "$out/$label-claims" "$appliance" "$out/a/$label" <<'EOF'
import os, sys
src, dst, old, new = sys.argv[1:]
old_b = old.encode()
head, tail = os.path.split(new)
pad = len(old) - len(new)
if pad < 0:
    sys.exit(f"{new} is {-pad} bytes longer than {old}: use a shorter OUT")
new_b = (head + "/" * (pad + 1) + tail).encode()
data = open(src, "rb").read()
n = data.count(old_b)
if n == 0:
    sys.exit(f"{old} not found in {src}")
open(dst, "wb").write(data.replace(old_b, new_b))
os.chmod(dst, 0o755)
print(f"{dst}: {n} reference(s) to the appliance now {new_b.decode()}")
EOF
  {
    echo "label $label"
    echo "commit $(git -C "$src" rev-parse HEAD) $(git -C "$src" log -1 --format='%ad %s' --date=iso | cut -c1-160)"
    echo "variant ${variant:-none}"
    echo "built $(date -u +%FT%TZ) in $((t1 - t0)) s, CARGO_TARGET_DIR=$target, from $bench"
    sha256sum "$out/$label-claims" "$out/a/$label"
  } >"$out/$label.txt"
  echo "$label: $out/$label-claims ($((t1 - t0)) s)"
done
