#!/usr/bin/env bash
# A build of the kernels' compile-time experiment switches beside the default one, for bench/ab.sh:
#   bash bench/variant.sh NAME "-DSWITCH=1 [-DOTHER=1 ...]"
# copies the tree and its build/ (built first: make all build/bench/dsa_bench build/tests/dsa_tests)
# to .ab/NAME, touches the sources that mention each switch (the Makefile does not track flags; for a
# header, the .cu files that include it), and
# rebuilds there with NVCCFLAGS="-O3 -lineinfo <switches>" (the Makefile adds its own flags), so only
# those files recompile. Then: .ab/NAME/build/bench/dsa_bench and .ab/NAME/build/tests/dsa_tests.
# JOBS (default 8) sets make -j; two variants can build at once.
set -eu
if [ $# -ne 2 ]; then sed -n 2,8p "$0"; exit 2; fi
NAME=$1 FLAGS=$2
[ -x build/bench/dsa_bench ] && [ -x build/tests/dsa_tests ] || { echo "variant.sh: build the default first"; exit 1; }
DIR=.ab/$NAME
rm -rf "$DIR"; mkdir -p "$DIR"
cp -a Makefile include src cuda tests bench build "$DIR"/
[ -d examples ] && cp -a examples "$DIR"/
for f in $FLAGS; do
  sw=${f#-D}; sw=${sw%%=*}
  files=$(grep -rl --include='*.cu' --include='*.cuh' "$sw" cuda || true)
  [ -n "$files" ] || { echo "variant.sh: no source under cuda/ mentions $sw"; exit 1; }
  # a header's switch: touch the .cu files that include it directly, not the header (every CUDA object
  # depends on every header in the Makefile, so a touched header would rebuild them all)
  cus=""
  for src in $files; do
    case $src in
      *.cuh) cus="$cus $(grep -rl --include='*.cu' "include \"[^\"]*$(basename "$src")\"" cuda || true)" ;;
      *) cus="$cus $src" ;;
    esac
  done
  (cd "$DIR" && touch $cus)
done
cd "$DIR" && make -j"${JOBS:-8}" build/bench/dsa_bench build/tests/dsa_tests NVCCFLAGS="-O3 -lineinfo $FLAGS"
