#!/usr/bin/env bash
# Runs a command under a wall-clock limit in its own process group and kills the whole group at the
# limit, Criterion's forked test workers included:
#   bash bench/limit.sh SECONDS CMD [ARGS ...]
# (plain `timeout` kills only its child: a hung test's workers then keep the GPU, and on a machine in
# exclusive compute mode every later process of the script finds no device). Exit status:
# the command's, or 137 when the limit killed it.
set -u
if [ $# -lt 2 ]; then sed -n 2,7p "$0"; exit 2; fi
secs=$1; shift
setsid "$@" &
pid=$!
# the watchdog in its own process group, holding none of our output (a pipe reader such as tee must
# not wait for its sleep)
setsid bash -c "sleep $secs; kill -KILL -$pid 2>/dev/null" </dev/null >/dev/null 2>&1 &
watch=$!
wait "$pid"; rc=$?
kill -KILL -"$watch" 2>/dev/null
kill -KILL -"$pid" 2>/dev/null   # workers left behind by a command that exited
exit $rc
