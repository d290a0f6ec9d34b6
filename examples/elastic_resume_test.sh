#!/bin/sh
# Usage: elastic_resume_test.sh SCRATCH_DIR TUTTIRUN PROGRAM [FLAG...]
# examples/fashion_mnist (or libtorch_mnist) --elastic under tuttirun's elastic mode on this
# machine (2 ranks), run undisturbed and then with a rank killed once epoch 2 is under way: the
# relaunched job resumes from its last commit and must print the same epoch-2 train loss and
# final accuracy as the undisturbed run (the epoch's loss so far is committed; before, the
# resumed epoch's loss averaged only the relaunch's steps). The FLAGs go to every run after
# the script's own, which they override (e.g. --wrapper zero, whose sharded optimizer state
# the commits consolidate; --limit). The runs' temporary files (libtorch_mnist unpacks the
# data set there) go to SCRATCH_DIR/tmp, removed at the end: a killed rank leaves its own.
set -eu
dir=$1 tuttirun=$2 program=$3
shift 3
rm -rf "$dir"
mkdir -p "$dir/tmp"
export TMPDIR="$dir/tmp"
# The host as Open MPI names it in its failure reports: this machine is never excluded, whichever
# name the script gives it (before, this name excluded the only host and the job ended).
printf '#!/bin/sh\necho %s:2\n' "$(hostname)" > "$dir/hosts.sh"
chmod +x "$dir/hosts.sh"
# run NAME FLAG...: the commits of each run in a folder of its own under SCRATCH_DIR (not
# tuttirun's default under /tmp, which outlives the test).
run() {
  commits="$dir/commits-$1"
  shift
  TUTTI_ELASTIC_DIR="$commits" "$tuttirun" --host-discovery-script "$dir/hosts.sh" -np 2 \
    --mpi-args=--oversubscribe "$program" --elastic --epochs 2 --limit 30000 --commit-every 10 "$@"
}
run undisturbed "$@" > "$dir/undisturbed.log" 2>&1 || { cat "$dir/undisturbed.log"; exit 1; }
run killed "$@" > "$dir/killed.log" 2>&1 &
job=$!
# Epoch 2's first progress line comes after a commit (fashion_mnist: after 100 of its ~235
# steps per rank; libtorch_mnist: after its first commit of the epoch).
until grep -q "epoch 2 \[" "$dir/killed.log"; do
  kill -0 "$job" 2>/dev/null || break
  sleep 0.05
done
pkill -9 -n -x "$(basename "$program")" || true  # The newest rank.
status=0
wait "$job" || status=$?
cat "$dir/killed.log"
[ "$status" -eq 0 ] || { echo "the killed run exited $status"; exit 1; }
grep -q "resumed at commit [0-9]*: epoch 2" "$dir/killed.log" ||
  { echo "no relaunch resumed epoch 2 (the kill came too late?)"; exit 1; }
field() { sed -n "s/.*$1 \\([0-9.]*\\).*/\\1/p" "$2" | tail -1; }
loss_a=$(field "epoch 2: train loss" "$dir/undisturbed.log")
loss_b=$(field "epoch 2: train loss" "$dir/killed.log")
acc_a=$(field "final test accuracy:" "$dir/undisturbed.log")
acc_b=$(field "final test accuracy:" "$dir/killed.log")
echo "epoch-2 train loss: undisturbed $loss_a, resumed $loss_b; accuracy $acc_a / $acc_b"
# The sums are associated differently (folded at each commit): equal to the printed digits,
# give or take the last one.
awk -v a="$loss_a" -v b="$loss_b" -v x="$acc_a" -v y="$acc_b" 'BEGIN {
  d = a - b; if (d < 0) d = -d; e = x - y; if (e < 0) e = -e;
  exit !(a != "" && b != "" && d <= 0.00011 && e <= 0.011) }' ||
  { echo "the resumed run differs from the undisturbed one"; exit 1; }
rm -rf "$dir/tmp"
