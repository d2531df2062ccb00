#!/usr/bin/env bash
# Stops what tests/slurm/start.sh started (by the process ids it wrote), and cancels its jobs.
set -uo pipefail
DIR="${GSPO_SLURM_DIR:-/tmp/gspo-slurm}"
[ -d "$DIR" ] || exit 0
if [ -f "$DIR/slurm.conf" ]; then
	SLURM_CONF="$DIR/slurm.conf" timeout 10 scancel --full --quiet --user "$(id -un)" 2>/dev/null || true
fi
for name in slurmd.launcher slurmctld.launcher munge/munged; do
	pidfile="$DIR/$name.pid"
	[ -f "$pidfile" ] || continue
	pid="$(cat "$pidfile")"
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$pidfile"
done
echo "slurm: stopped ($DIR)"
