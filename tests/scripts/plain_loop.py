"""A plain training script in the style of public ones (no clusterjob import): DDP over
gloo, `iter N: loss X` on stdout every step, an eval line through `logging` (stderr)
every 5 steps, and a checkpoint written where --ckpt says (default: the working
directory), from which it resumes. --stubborn swallows every stop and goes on."""

import argparse
import logging
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100_000)
p.add_argument("--ckpt", default="checkpoint.pt")
p.add_argument("--sleep", type=float, default=0.05)
p.add_argument("--stubborn", action="store_true")
a = p.parse_args()
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # stderr, as timm logs
dist.init_process_group("gloo")
rank = dist.get_rank()
step = torch.load(a.ckpt)["step"] if os.path.exists(a.ckpt) else 0
if rank == 0:
    print(f"starting at step {step} in {os.getcwd()}", flush=True)
while step < a.steps:
    try:
        step += 1
        t = torch.ones(1)
        dist.all_reduce(t)
        if rank == 0:
            print(f"iter {step}: loss {1.0 / step:.4f}", flush=True)
            if step % 5 == 0:
                logging.info("eval step %d top1 %.2f", step, 50 + step / 10)
                torch.save({"step": step}, a.ckpt)
        time.sleep(a.sleep)
    except BaseException:
        if not a.stubborn:
            raise
dist.destroy_process_group()
