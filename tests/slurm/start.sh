#!/usr/bin/env bash
# A real single-node SLURM for the executor tests: munged, slurmctld -D and slurmd -D under
# one directory (GSPO_SLURM_DIR, default /tmp/gspo-slurm), configured for this machine's CPUs,
# with its own munge key, socket and ports so it touches no system-wide service. Installs
# Debian's slurm-wlm and munge first when they are missing (as root, with apt-get).
# Prints the directory; `export SLURM_CONF=$GSPO_SLURM_DIR/slurm.conf` points sbatch, squeue and
# scancel at it (tests/slurm/conftest.py does). Exit 3 when SLURM cannot be had here, with why.
set -euo pipefail
DIR="${GSPO_SLURM_DIR:-/tmp/gspo-slurm}"
HERE="$(cd "$(dirname "$0")" && pwd)"

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
	if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
		echo "slurm: slurm-wlm and munge are not installed and cannot be (needs root and apt-get)" >&2
		exit 3
	fi
	echo "slurm: installing slurm-wlm and munge (apt-get)" >&2
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge; } >&2 || {
		echo "slurm: apt-get could not install slurm-wlm and munge" >&2
		exit 3
	}
fi

"$HERE/stop.sh" >/dev/null 2>&1 || true
rm -rf "$DIR"
mkdir -p "$DIR"/{state,spool,munge,log}
chmod 711 "$DIR/munge"
HOST="$(hostname -s)"
CPUS="$(nproc)"
MEM_MB="$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)"

# Our own key: munged refuses a key others can read, and the system's belongs to user munge.
head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
chmod 600 "$DIR/munge/munge.key"
munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.sock" \
	--pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed"

cat >"$DIR/slurm.conf" <<CONF
ClusterName=gspo-test
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
SlurmctldPort=${GSPO_SLURMCTLD_PORT:-16817}
SlurmdPort=${GSPO_SLURMD_PORT:-16818}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.sock
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# a job's SIGTERM and its SIGKILL KillWait seconds apart: time to write a checkpoint
KillWait=30
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
printf "CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\nCgroupAutomount=no\n" >"$DIR/cgroup.conf"

export SLURM_CONF="$DIR/slurm.conf"
nohup slurmctld -D -f "$SLURM_CONF" >"$DIR/log/slurmctld.out" 2>&1 &
echo $! >"$DIR/slurmctld.launcher.pid"
nohup slurmd -D -f "$SLURM_CONF" >"$DIR/log/slurmd.out" 2>&1 &
echo $! >"$DIR/slurmd.launcher.pid"

# Up when the node answers idle (or mixed/allocated: a leftover job is no reason to wait).
for _ in $(seq 1 60); do
	state="$(sinfo -h -N -o %T 2>/dev/null | head -1 || true)"
	case "$state" in
	idle* | mixed* | alloc*)
		echo "$DIR"
		exit 0
		;;
	esac
	if ! kill -0 "$(cat "$DIR/slurmd.launcher.pid")" 2>/dev/null || ! kill -0 "$(cat "$DIR/slurmctld.launcher.pid")" 2>/dev/null; then
		state="a daemon exited"
		break
	fi
	sleep 1
done
echo "slurm: the node did not come up (state: ${state:-none}); logs in $DIR/log" >&2
tail -n 5 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" "$DIR/log/slurmd.out" >&2 || true
exit 3
