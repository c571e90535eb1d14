#!/usr/bin/env bash
# Interleave a bench of this tree against the same bench at an older commit, ABBA order
# (old cur cur old, then cur old old cur, ...), so a slow or fast stretch of the machine
# falls on both sides alike; then print each metric's medians, quartiles, ranges and the
# ratio cur/old of the medians and per quad.
#
#   scripts/bench-abba.sh OLD_REV QUADS OUTDIR BENCH [METRIC_REGEX...] -- BENCH_ARGS...
#
# e.g. scripts/bench-abba.sh 68a3e2b 10 /tmp/abba http_bench \
#        'iPXE script requests/s: bootplane (\d+)' -- --size-mib 64 --secs 8 --rounds 1
#
# OLD_REV is built in a git worktree under $ABBA_DIR (default /var/tmp/bootplane-abba,
# outside this checkout so cargo does not take this workspace for the old one's) with its
# own target dir, this tree into target/abba-cur, both with `cargo bench --no-run`. Each run's output is kept
# in OUTDIR/BENCH-N-{old,cur}.txt. A run waits 5 s after the one before, so one's tail
# does not load the next. Run nothing else meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
old_rev=$1 quads=$2 out=$3 bench=$4
shift 4
metrics=()
while [[ $# -gt 0 && $1 != -- ]]; do metrics+=("$1"); shift; done
[[ ${1:-} == -- ]] && shift
mkdir -p "$out"
root=$PWD
abba=${ABBA_DIR:-/var/tmp/bootplane-abba}
wt=$abba/src
mkdir -p "$abba"
if [[ ! -d $wt ]]; then
  git worktree add --detach "$wt" "$old_rev" >/dev/null
else
  git -C "$wt" checkout -q --detach "$old_rev"
fi
build() { # DIR TARGET_DIR: the bench binary's path (the build's errors on failure)
  local json=$abba/build.json
  if ! (cd "$1" && CARGO_TARGET_DIR=$2 cargo bench --bench "$bench" --no-run --message-format=json) \
    >"$json" 2>"$abba/build.log"; then
    echo "building $bench in $1 failed:" >&2
    tail -20 "$abba/build.log" >&2
    return 1
  fi
  python3 -c 'import json,sys
for l in open(sys.argv[2]):
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$bench" "$json" | tail -1
}
declare -A bin dir n
bin[old]=$(build "$wt" "$abba/target")
bin[cur]=$(build "$root" "$root/target/abba-cur")
dir[old]=$wt dir[cur]=$root n[old]=0 n[cur]=0
echo "old $old_rev ${bin[old]}"
echo "cur $(git rev-parse --short HEAD) ${bin[cur]}"
for q in $(seq 1 "$quads"); do
  if (( q % 2 )); then order="old cur cur old"; else order="cur old old cur"; fi
  for side in $order; do
    sleep 5
    n[$side]=$(( ${n[$side]} + 1 ))
    echo "=== quad $q $side run ${n[$side]} $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd "${dir[$side]}" && "${bin[$side]}" --bench "$@") > "$out/$bench-${n[$side]}-$side.txt" 2>&1 ||
      echo "run failed: $out/$bench-${n[$side]}-$side.txt"
  done
done
python3 - "$out" "$bench" "$quads" "${metrics[@]}" <<'EOF'
import re, statistics as st, sys
out, bench, quads, pats = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
def val(i, side, pat):
    m = re.search(pat, open(f"{out}/{bench}-{i}-{side}.txt").read())
    return float(m.group(1)) if m else None
def quart(v):
    v = sorted(v)
    return v[len(v) // 4], v[(3 * len(v)) // 4]
for pat in pats:
    v = {s: [val(i, s, pat) for i in range(1, 2 * quads + 1)] for s in ("old", "cur")}
    if None in v["old"] + v["cur"]:
        print(f"{pat}: missing in some runs")
        continue
    mo, mc = st.median(v["old"]), st.median(v["cur"])
    per = [(v["cur"][2 * q] + v["cur"][2 * q + 1]) / (v["old"][2 * q] + v["old"][2 * q + 1]) for q in range(quads)]
    (o1, o3), (c1, c3) = quart(v["old"]), quart(v["cur"])
    print(f"{pat}\n  old {mo:.2f} (IQR {o1:.2f}-{o3:.2f}, {min(v['old']):.2f}-{max(v['old']):.2f})"
          f"  cur {mc:.2f} (IQR {c1:.2f}-{c3:.2f}, {min(v['cur']):.2f}-{max(v['cur']):.2f})\n"
          f"  cur/old: {mc / mo:.3f} by medians; per quad {st.median(per):.3f} ({min(per):.3f}-{max(per):.3f})")
EOF
