"""A sweep point that does what ``clusterjob.params["role"]`` says: "short" runs 3 s and
ends, "long" runs until stopped, "die" has rank 1 killed by SIGKILL after half a second
(rank 0 runs on). Each rank first prints what the machine gave it: its CPU affinity,
OMP_NUM_THREADS and CUDA_VISIBLE_DEVICES, as one JSON line starting with "facts "."""

import json
import os
import signal
import time

import clusterjob

role = clusterjob.params["role"]
rank = int(os.environ["RANK"])
print("facts " + json.dumps({"rank": rank, "cpus": sorted(os.sched_getaffinity(0)),
                             "omp": os.environ.get("OMP_NUM_THREADS"),
                             "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)
if role == "die" and rank == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
deadline = time.time() + (3 if role == "short" else 600)
while time.time() < deadline:
    time.sleep(0.1)
