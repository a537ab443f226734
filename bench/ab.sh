#!/usr/bin/env bash
# Same-run A/B of two builds (or two settings) of dsa_bench on one GPU: the two commands run as
# separate processes, alternated A, B, A, B, ... (AB_ROUNDS rounds, default 2), each with its own
# loop of reps as dsa_bench times every row; then one line per row: the mean ms of A and of B, B / A,
# and the peer's (FlashMLA's) ratio in each when --flashmla is in the commands.
#   bash bench/ab.sh OUT SHAPES LABEL_A "CMD_A" LABEL_B "CMD_B"
# CMD is a dsa_bench command line without --shapes / --out, environment assignments allowed, e.g.
#   bash bench/ab.sh /tmp/ab fwd-glm-4k,bwd-glm-4k asc "DSA_X=1 /tmp/base/dsa_bench" new "build/bench/dsa_bench"
# Files: OUT/ab_<label>_<round>.json (dsa_bench's rows) and .log; set DSA_COMMIT in CMD for labels.
set -u
if [ $# -ne 6 ]; then sed -n 2,9p "$0"; exit 2; fi
exec bash "$(dirname "$0")/ab_multi.sh" "$1" "$2" "$3=$4" "$5=$6"
