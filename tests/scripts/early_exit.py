"""A plain script shaped like pytorch/examples' word_language_model (no clusterjob import):
DDP over gloo, epochs of training inside ``try: ... except KeyboardInterrupt:``; on Ctrl-C
each rank prints "Exiting from training early", then tests its best model, and rank 0
prints the test loss as the example does ("| End of training | test loss  4.52 | ...").
--on-interrupt test (the example's way), exit0 (sys.exit(0) at once) or ignore (swallow it
and train on). The steps hold no collective, so a Ctrl-C never finds one rank waiting in
a collective for a rank that already left the loop; the ranks meet once more after the
test, which only ranks that both got on to their end pass."""

import argparse
import math
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=100_000)
p.add_argument("--on-interrupt", default="test", choices=["test", "exit0", "ignore"])
a = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 8), torch.randn(64, 1)


def evaluate() -> float:
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(x), y).item()


def train() -> None:
    for epoch in range(1, a.epochs + 1):
        for _ in range(5):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            time.sleep(0.02)
        if rank == 0:
            print(f"| end of epoch {epoch:3d} | valid loss {evaluate():5.2f}", flush=True)


while True:
    try:
        train()
        break
    except KeyboardInterrupt:
        if a.on_interrupt == "ignore":
            print("ignoring Ctrl-C", flush=True)
            continue
        print("-" * 89)
        print("Exiting from training early", flush=True)
        if a.on_interrupt == "exit0":
            sys.exit(0)
        break

test_loss = evaluate()
time.sleep(1)  # the test set takes a moment
if rank == 0:
    print(f"| End of training | test loss {test_loss:5.2f} | test ppl {math.exp(test_loss):8.2f}", flush=True)
dist.barrier()
dist.destroy_process_group()
