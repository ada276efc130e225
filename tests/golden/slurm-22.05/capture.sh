#!/bin/bash
# Captures the files of this folder from a running Slurm (the local one:
# SLURM_CONF=/tmp/clusterjob-slurm/etc/slurm.conf), with the exact commands and formats
# clusterjob.core.slurmctl and clusterjob.launch.preflight ask. It submits a few one-CPU
# jobs of seconds: one that completes, one that fails, a 3-task array, one requeued once
# and then cancelled, one held (pending), and one whose name holds spaces and "=". A
# partition "golden" (MaxNodes=1, MaxTime=5) and a QOS "golden" (MaxWall 5 min, MaxTRES
# node=1,cpu=4, MaxSubmitJobsPerUser 100) exist while it runs, so that limits are in the
# answers; both are removed.
set -euo pipefail
cd "$(dirname "$0")"
cleanup() {
    scontrol delete PartitionName=golden 2>/dev/null || true
    sacctmgr -i delete qos golden >/dev/null 2>&1 || true
}
trap cleanup EXIT
scontrol create PartitionName=golden Nodes=node1,node2 MaxNodes=1 MaxTime=5 State=UP
sacctmgr -i add qos golden MaxWall=00:05:00 MaxTRESPerJob=node=1,cpu=4 MaxSubmitJobsPerUser=100 >/dev/null
run() { sbatch --parsable -o /dev/null -e /dev/null -c 1 --mem=100M --chdir=/tmp "$@"; }
ok=$(run --wrap 'sleep 2')
bad=$(run --wrap 'sleep 1; exit 3')
array=$(run --array=0-2 --wrap 'sleep 1')
odd=$(run --job-name 'a b StartTime=2099-01-01T00:00:00 x=' --wrap 'sleep 1')
requeued=$(run --requeue --wrap 'sleep 60')
held=$(run --hold --wrap 'sleep 1')
until [ "$(squeue -h -j "$requeued" -o %T)" = RUNNING ]; do sleep 1; done
sleep 2
scontrol requeue "$requeued"
until [ "$(squeue -h -j "$requeued" -o %T)" = RUNNING ]; do sleep 1; done
sleep 1
scontrol show job -o "$requeued" > scontrol_show_job_running.txt
scontrol show job -o "$held" > scontrol_show_job_pending.txt
scontrol show job -o "$odd" > scontrol_show_job_odd_name.txt
squeue -r -o '%i|%T' -j "$ok,$requeued,$held,${array}" > squeue.txt || true
scancel "$requeued"
until [ -z "$(squeue -h -j "$ok,$bad,$array,$odd,$requeued" -o %i)" ]; do sleep 1; done
sleep 2  # slurmdbd writes the last end times a moment later
ids="$ok,$bad,$array,$odd,$requeued,$held"
SLURM_TIME_FORMAT=%s sacct -D -X -P -o JobID,State,Submit,Start,End,ElapsedRaw,AllocTRES -j "$ids" > sacct_segments.txt
sacct -X -P -o JobID,State -j "$ids" > sacct_states.txt
scancel "$held"
scontrol show partition -o > scontrol_show_partition.txt
scontrol show config > scontrol_show_config.txt
sinfo -N -p debug -o '%N|%c|%G|%f' > sinfo_nodes.txt
qos_format=format=Name,MaxWall,MaxTRES,MaxSubmitPU,MaxSubmitPA,GrpSubmit
sacctmgr -P show qos "$qos_format" > sacctmgr_show_qos.txt
sacctmgr -P show qos golden "$qos_format" > sacctmgr_show_qos_golden.txt
sacctmgr -P show assoc where user="$(id -un)" format=Cluster,Account,Partition,MaxSubmit,GrpSubmit,DefaultQOS \
    > sacctmgr_show_assoc.txt
squeue -r -t all -o '%i|%u|%a|%q|%T' > squeue_all.txt
printf 'ok=%s failed=%s array=%s odd_name=%s requeued=%s held=%s\n' "$ok" "$bad" "$array" "$odd" "$requeued" "$held" > jobs.txt
