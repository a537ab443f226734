#!/usr/bin/env bash
# The machine-code check of the sm_90a kernels (make sass-check; make test runs
# it): cuobjdump -sass of every CUDA object under the folder given (default build/obj/cuda), and a
# failure for each instruction whose 64-bit uniform memory descriptor is an odd register pair
# (desc[UR<odd>]). CUDA 13.0's ptxas emitted one (an L2-hinted LDGSTS with desc[UR1]) when a
# shared-memory destination split into a uniform base and a per-thread offset; the H200 raises an
# illegal instruction on it, and nothing else catches it before a GPU run.
# cuobjdump and the nvdisasm it calls: from PATH, the CUDA toolkit, or the nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm wheels (pip; .ci/run installs them). Without them the check says so and passes;
# with them, an object whose sm_90a code does not disassemble fails it.
set -u
DIR=${1:-build/obj/cuda}
find_tool() {
  local t
  t=$(command -v "$1" || true)
  [ -n "$t" ] || [ ! -x "/usr/local/cuda/bin/$1" ] || t=/usr/local/cuda/bin/$1
  [ -n "$t" ] || t=$(python3 - "$1" 2>/dev/null <<'PY'
import glob, os, site, sys
for p in site.getsitepackages() + [site.getusersitepackages()]:
    for c in sorted(glob.glob(os.path.join(p, "nvidia", "*", "bin", sys.argv[1]))):
        if os.access(c, os.X_OK):
            print(c); sys.exit(0)
PY
)
  echo "$t"
}
objdump=$(find_tool cuobjdump)
disasm=$(find_tool nvdisasm)
if [ -z "$objdump" ] || [ -z "$disasm" ]; then
  {
    echo "************************************************************************************************"
    echo "sass-check: NOT RUN. No cuobjdump / nvdisasm was found, so the sm_90a machine code was not checked"
    echo "for the odd-descriptor encoding that raises an illegal instruction on the GPU."
    echo "Install them (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, or the CUDA toolkit's bin/)."
    echo "************************************************************************************************"
  } >&2
  exit 0
fi
NVDISASM_PATH=$(dirname "$disasm")
export NVDISASM_PATH
objs=$(find "$DIR" -name '*.o' 2>/dev/null | sort)
[ -n "$objs" ] || { echo "sass-check: no objects under $DIR (build first: make all)"; exit 1; }
bad=0 n=0 ninst=0
for o in $objs; do
  n=$((n + 1))
  sass=$(PATH="$NVDISASM_PATH:$PATH" "$objdump" -sass "$o" 2>&1)
  if printf '%s\n' "$sass" | grep -q "fatal"; then
    printf '%s\n' "$sass" | grep "fatal" | sed "s|^|sass-check: $o: |"; bad=1; continue
  fi
  k=$(printf '%s\n' "$sass" | grep -c "^ */\*[0-9a-f]\{4,\}\*/" || true)
  nf=$(printf '%s\n' "$sass" | grep -c "Function :" || true)
  if [ "$nf" -gt 0 ] && [ "$k" -eq 0 ]; then
    echo "sass-check: $o: $nf functions but no instruction disassembled"; bad=1; continue
  fi
  ninst=$((ninst + k))
  out=$(printf '%s\n' "$sass" | awk -v obj="$o" '
    /Function :/ { fn = $3 }
    /desc\[UR[0-9]*[13579]\]/ { sub(/^[ \t]*/, ""); print obj ": " fn ": " $0 }')
  if [ -n "$out" ]; then printf '%s\n' "$out"; bad=1; fi
done
if [ $bad -ne 0 ]; then
  echo "sass-check: FAILED (odd uniform register pairs as memory descriptors, or objects that do not disassemble: above)"
  exit 1
fi
echo "sass-check: $n objects, $ninst instructions, no odd-pair memory descriptor ($objdump)"
