#!/usr/bin/env bash
# Run several builds of a bench interleaved (A B C ... A B C ...) and print, per build,
# the median and range of each figure. Written for issue 35 item 4, the claims bench at
# each suspect commit of the embedded regression (docs/benchmarks.md, "Claims at each
# suspect commit"), but any bench printing the claims bench's per-run lines works.
#
#   scripts/bench-builds.sh [-r ROUNDS] [-l LOAD] [-t SECS] [-o LOGDIR] [-z] [-k] [-f FILE] [LABEL=COMMAND ...]
#
#   -r ROUNDS  rounds (3); each round runs every entry once, in the order given
#   -l LOAD    before each run, wait until /proc/loadavg's 1-minute figure is below LOAD
#              (0.6) ...
#   -t SECS    ... for at most SECS (600); then a warning line, and the run goes on
#   -o LOGDIR  each run's output as LOGDIR/NN-LABEL.txt, the figures of every run in
#              LOGDIR/runs.tsv, the table in LOGDIR/table.txt (default /tmp/bench-builds-TIME)
#   -z         reverse the order every other round (A B C, C B A, ...)
#   -k         keep the page cache (by default it is dropped before each run)
#   -f FILE    entries from FILE, one `LABEL=COMMAND` a line (# comments, blank lines)
#
# COMMAND runs under `bash -c`, so `VAR=value binary args` works. The page cache is dropped
# before each run (`sync; echo 3 > /proc/sys/vm/drop_caches`, root; else one warning).
# A run that fails still counts: its exit code is in runs.tsv and its figures are left out.
#
# The claims binaries come from `cargo bench --bench claims --no-run` at each commit, each
# with a copy of the appliance it starts (it runs env!("CARGO_BIN_EXE_bootplane"), a path
# into the target dir that the next commit's build overwrites): scripts/bisect-claims-build.sh
# builds them. Every version of the bench prints the same per-run lines:
#   applied N claims in X s (Y/s) from C clients
#   bound B of N claims in T s: R claims bound/s; apply->Bound p50 X s p99 Y s max Z s
#   server CPU: A s registering (to 0.5s after), B s for the claims
#   server memory with N machines: RSS X MiB, peak Y MiB
# (since 398762f, the etcd store's bench, after a `--- round R of RR: SIDE ---` line; the
# older ones run the embedded store only, once, and take no --rounds/--backends; the
# extraction does not depend on the version). Figures in the table:
# bound_s (first apply to last Bound), claims_s (bound/s), p50_s, p99_s, max_s,
# applied_s (the POSTs), cpu_s (appliance CPU for the claims), rss_peak_mib; a line
# per LABEL and store side; "vs prev" is the median over the previous label's median of
# the same figure (the entries in step order give each step's cost). COMMIT is the
# leading hex of LABEL, else of the command's first word's file name.
#
# Issue 35 item 4's bisection (binaries in /work/bench/bisect, built by
# scripts/bisect-claims-build.sh; docs/benchmarks.md says which step each isolates):
#   scripts/bench-builds.sh -r 5 -o /tmp/bisect-claims -f scripts/bisect-claims.list
set -euo pipefail
rounds=3 load_max=0.6 wait_max=600 logdir= zigzag=0 keep_cache=0
entries=()
while getopts "r:l:t:o:zkf:" o; do
  case $o in
    r) rounds=$OPTARG ;;
    l) load_max=$OPTARG ;;
    t) wait_max=$OPTARG ;;
    o) logdir=$OPTARG ;;
    z) zigzag=1 ;;
    k) keep_cache=1 ;;
    f) while IFS= read -r line || [[ -n $line ]]; do
         [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
         entries+=("$line")
       done <"$OPTARG" ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
entries+=("$@")
(( ${#entries[@]} )) || { echo "no LABEL=COMMAND entries (-h for usage)" >&2; exit 2; }
labels=() cmds=() commits=()
for e in "${entries[@]}"; do
  [[ $e == *=* ]] || { echo "not LABEL=COMMAND: $e" >&2; exit 2; }
  l=${e%%=*} c=${e#*=}
  [[ $l =~ ^[A-Za-z0-9._+-]+$ ]] || { echo "label $l: letters, digits and ._+- only" >&2; exit 2; }
  for x in "${labels[@]}"; do [[ $x != "$l" ]] || { echo "label $l twice" >&2; exit 2; }; done
  first=${c%% *}
  if [[ $l =~ ^([0-9a-f]{7,40}) ]]; then commit=${BASH_REMATCH[1]}
  elif [[ $(basename "$first") =~ ^([0-9a-f]{7,40}) ]]; then commit=${BASH_REMATCH[1]}
  else commit=-; fi
  labels+=("$l") cmds+=("$c") commits+=("$commit")
done
logdir=${logdir:-/tmp/bench-builds-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$logdir"
tsv=$logdir/runs.tsv
printf 'run\tround\tlabel\tcommit\tstart\tload1\trc\tside\tfigure\tvalue\n' >"$tsv"

wait_quiet() { # until load1 < load_max, at most wait_max s
  local t0=$SECONDS l
  while :; do
    l=$(cut -d' ' -f1 /proc/loadavg)
    awk -v l="$l" -v m="$load_max" 'BEGIN { exit !(l < m) }' && return 0
    if (( SECONDS - t0 >= wait_max )); then
      echo "WARNING: load average $l still >= $load_max after ${wait_max}s; running anyway" |
        tee -a "$logdir/warnings.txt"
      return 0
    fi
    sleep 5
  done
}
drop_warned=0
drop_caches() {
  sync
  if ! { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null; then
    (( drop_warned )) || echo "WARNING: cannot drop caches (not root?); runs go on without" |
      tee -a "$logdir/warnings.txt"
    drop_warned=1
  fi
}
# The figures of one run's output as "side figure value" lines.
extract() {
  awk '
    function num(s) { gsub(/[^0-9.]/, "", s); return s }
    BEGIN { side = "embedded" }
    /^--- round [0-9]+ of [0-9]+: / { side = $0; sub(/^--- round [0-9]+ of [0-9]+: /, "", side); sub(/ *---$/, "", side); next }
    /^applied [0-9]+ claims in / { print side, "applied_s", num($5) }
    /^bound [0-9]+ of [0-9]+ claims in / {
      print side, "bound_s", num($7)
      print side, "claims_s", num($8)
      for (i = 1; i <= NF; i++) {
        if ($i == "p50") print side, "p50_s", num($(i + 1))
        if ($i == "p99") print side, "p99_s", num($(i + 1))
        if ($i == "max") print side, "max_s", num($(i + 1))
      }
      print side, "bound_all", ($2 == $4 ? 1 : 0)
    }
    /^server CPU: / { for (i = 1; i <= NF; i++) if ($i == "for") v = $(i - 1); print side, "cpu_s", num(v) }
    /^server memory with / { print side, "rss_peak_mib", num($NF == "MiB" ? $(NF - 1) : $NF) }
    /^timed out: only / { print side, "bound_all", 0 }
  ' "$1"
}

n=${#labels[@]} run=0
echo "$n builds x $rounds rounds; logs in $logdir"
for (( r = 1; r <= rounds; r++ )); do
  order=$(seq 0 $((n - 1)))
  (( zigzag && r % 2 == 0 )) && order=$(seq $((n - 1)) -1 0)
  for i in $order; do
    run=$((run + 1))
    wait_quiet
    (( keep_cache )) || drop_caches
    load1=$(cut -d' ' -f1 /proc/loadavg) start=$(date -u +%FT%TZ)
    out=$(printf '%s/%02d-%s.txt' "$logdir" "$run" "${labels[i]}")
    echo "=== run $run round $r ${labels[i]} $start load $(cut -d' ' -f1-3 /proc/loadavg)"
    { echo "# ${labels[i]}: ${cmds[i]}"; echo "# start $start load $(cat /proc/loadavg)"; } >"$out"
    rc=0
    bash -c "${cmds[i]}" >>"$out" 2>&1 </dev/null || rc=$?
    (( rc == 0 )) || echo "    exit code $rc (output: $out)"
    grep -E '^(bound [0-9]+ of|timed out)' "$out" | sed 's/^/    /' || true
    if (( rc == 0 )); then
      extract "$out" | while read -r side fig val; do
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$run" "$r" "${labels[i]}" \
          "${commits[i]}" "$start" "$load1" "$rc" "$side" "$fig" "$val"
      done >>"$tsv"
    else
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t-\t-\t-\n' "$run" "$r" "${labels[i]}" \
        "${commits[i]}" "$start" "$load1" "$rc" >>"$tsv"
    fi
  done
done

# The table: per label (in the order given), side and figure: runs, median, min, max,
# and the median over the previous label's median of the same side and figure.
awk -F'\t' -v order="$(printf '%s\n' "${labels[@]}")" '
  BEGIN {
    nl = split(order, lab, "\n")
    nf = split("bound_s claims_s p50_s p99_s max_s applied_s cpu_s rss_peak_mib bound_all", fig, " ")
  }
  NR == 1 || $8 == "-" { if (NR > 1) failed[$3]++; next }
  {
    k = $3 SUBSEP $8 SUBSEP $9
    cnt[k]++; v[k, cnt[k]] = $10 + 0
    commit[$3] = $4; sides[$8] = 1
  }
  function median_of(k,   n, i, j, t, a) {
    n = cnt[k]
    for (i = 1; i <= n; i++) a[i] = v[k, i]
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    lo = a[1]; hi = a[n]
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    printf "%-16s %-9s %-9s %-13s %4s %10s %10s %10s %8s\n", "label", "commit", "side", "figure", "runs", "median", "min", "max", "vs prev"
    ns = 0; if ("embedded" in sides) side_list[++ns] = "embedded"
    for (s in sides) if (s != "embedded") side_list[++ns] = s
    for (si = 1; si <= ns; si++) {
      s = side_list[si]
      for (f = 1; f <= nf; f++) {
        prev = ""; if (f > 1 || si > 1) print ""
        for (i = 1; i <= nl; i++) {
          k = lab[i] SUBSEP s SUBSEP fig[f]
          if (!(k in cnt)) continue
          m = median_of(k)
          ratio = (prev != "" && prev != 0) ? sprintf("%.3f", m / prev) : "-"
          if (fig[f] == "bound_all") ratio = "-"
          printf "%-16s %-9s %-9s %-13s %4d %10.3f %10.3f %10.3f %8s\n", lab[i], commit[lab[i]], s, fig[f], cnt[k], m, lo, hi, ratio
          prev = m
        }
      }
    }
    for (l in failed) printf "%s: %d failed run(s), left out\n", l, failed[l]
  }
' "$tsv" | tee "$logdir/table.txt"
[[ -s $logdir/warnings.txt ]] && { echo "warnings:"; cat "$logdir/warnings.txt"; }
exit 0
