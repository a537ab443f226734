#!/usr/bin/env bash
# bench/ab_switches.sh - the A/B of compile-time experiment switches in one script run: builds
# the default tree and one variant per switch set (bench/variant.sh, in parallel), runs the given
# Criterion filters on every variant (each under bench/limit.sh, so a hung test cannot keep the GPU),
# then bench/ab.sh of the default against each variant that passed, and packs everything into one
# archive (one file to copy back from the GPU machine).
#
#   bash bench/ab_switches.sh OUT SHAPES FILTERS NAME="-DSWITCH=1 [...]" [NAME2="..." ...]
#
#   OUT      folder for logs and JSON; OUT.tgz is written at the end (put OUT where the GPU machine's output is collected)
#   SHAPES   dsa_bench shapes for the A/Bs (comma list)
#   FILTERS  Criterion filters, comma list (e.g. 'gpu_attn_bwd/*,gpu_indexer_train/*'), or - for none
#   NAME=... a variant: its name and its switches (bench/variant.sh NAME "SWITCHES")
#
# Environment: DEADLINE (seconds from the start, default 560): an A/B that would start after
# DEADLINE - AB_SECONDS (default 120) is skipped and said so, and the archive is always written;
# DSA_COMMIT (the default build's label; variants get +NAME); AB_ROUNDS (bench/ab.sh, default 2);
# DSA_BENCH_FLASHMLA (FlashMLA beside the fwd rows); TEST_SECONDS (per filter, default 120);
# DSA_TEST_REQUIRE_SM90 (default 1: a GPU test that skips fails). A variant whose tests fail is not
# timed. Ends with bench/ab.sh's table of each A/B.
set -u
if [ $# -lt 4 ]; then sed -n 2,22p "$0"; exit 2; fi
OUTD=$1 SHAPES=$2 FILTERS=$3; shift 3
DEADLINE=${DEADLINE:-560} ABS=${AB_SECONDS:-120} TS=${TEST_SECONDS:-120}
export DSA_TEST_REQUIRE_SM90=${DSA_TEST_REQUIRE_SM90:-1}
base_label=${DSA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUTD"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
pack() { tar czf "$OUTD.tgz" -C "$(dirname "$OUTD")" "$(basename "$OUTD")" && echo "packed $OUTD.tgz at $(el) s"; }
trap pack EXIT

echo "[$(el) s] default build"
make -j"$(nproc)" all build/bench/dsa_bench build/tests/dsa_tests > "$OUTD/build.log" 2>&1 ||
  { tail -30 "$OUTD/build.log"; exit 1; }

names=() flags=()
for v in "$@"; do names+=("${v%%=*}"); flags+=("${v#*=}"); done
jobs=$(( $(nproc) / ${#names[@]} )); [ "$jobs" -ge 2 ] || jobs=2
echo "[$(el) s] variants: ${names[*]} (make -j$jobs each)"
for i in "${!names[@]}"; do
  JOBS=$jobs bash "$here/variant.sh" "${names[$i]}" "${flags[$i]}" > "$OUTD/variant_${names[$i]}.log" 2>&1 &
done
wait
ok=()
for i in "${!names[@]}"; do
  n=${names[$i]}
  if [ ! -x ".ab/$n/build/bench/dsa_bench" ]; then
    echo "variant $n: build failed"; tail -15 "$OUTD/variant_$n.log"; continue
  fi
  pass=1
  if [ "$FILTERS" != - ]; then
    IFS=, read -r -a fl <<< "$FILTERS"
    for f in "${fl[@]}"; do
      log="$OUTD/test_${n}_$(echo "$f" | tr -c 'A-Za-z0-9_\n' _).log"
      bash "$here/limit.sh" "$TS" ".ab/$n/build/tests/dsa_tests" --jobs "$(nproc)" --filter "$f" > "$log" 2>&1
      rc=$?
      echo "[$(el) s] $n $f: rc $rc $(grep -h Synthesis "$log" | sed 's/.*Synthesis: //')"
      [ $rc -eq 0 ] || { pass=0; grep -h "FAIL\|Assertion\|error" "$log" | head -5; }
    done
  fi
  [ $pass -eq 1 ] && ok+=("$i")
done

for i in "${ok[@]}"; do
  n=${names[$i]}
  if [ $(( $(el) + ABS )) -gt "$DEADLINE" ]; then echo "[$(el) s] A/B base vs $n skipped: past DEADLINE - AB_SECONDS"; continue; fi
  echo "[$(el) s] A/B base vs $n (${flags[$i]})"
  bash "$here/limit.sh" $(( DEADLINE - $(el) )) bash "$here/ab.sh" "$OUTD/ab_$n" "$SHAPES" \
    base "DSA_COMMIT=$base_label build/bench/dsa_bench" \
    "$n" "DSA_COMMIT=$base_label+$n .ab/$n/build/bench/dsa_bench" | tee "$OUTD/ab_$n.txt"
done
echo "[$(el) s] done"
