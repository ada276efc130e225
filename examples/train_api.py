"""examples/mnist_ddp.py with clusterjob's five calls: it survives preemption with nothing lost.

    clusterjob submit jobs/own_api.yaml                  # on Slurm: USR2 before the time limit
    torchrun --nproc_per_node 2 examples/train_api.py    # still a plain script outside clusterjob

- ``clusterjob.params``: the run's params (the sweep point applied); {} outside a run.
- ``clusterjob.should_stop()``: True on every rank once any rank got SIGUSR2/SIGTERM.
- ``clusterjob.save_checkpoint(state, step)`` / ``clusterjob.load_checkpoint()``.
- ``clusterjob.requeue()``: after the checkpoint; this Slurm task is requeued and resumes.
- ``clusterjob.log(step=..., **metrics)``: metrics.jsonl, each step once across resumes.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import clusterjob
from mnist_ddp import Net, evaluate, mnist


def settings():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--data", default="./data")
    p.add_argument("--limit", type=int, default=None, help="use only the first N samples of each split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-every", type=int, default=5, help="steps between should_stop() calls")
    args = vars(p.parse_args())
    args.update({k.replace("-", "_"): v for k, v in clusterjob.params.items()})  # the run's params win
    return argparse.Namespace(**args)


def main():
    args = settings()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    if rank == 0:
        mnist(args.data, True, None)
    dist.barrier()
    train, test = mnist(args.data, True, args.limit), mnist(args.data, False, args.limit)
    sampler = DistributedSampler(train, seed=args.seed)
    train_loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    test_loader = DataLoader(test, batch_size=256, sampler=DistributedSampler(test, shuffle=False))

    torch.manual_seed(args.seed)
    model = DDP(Net().to(device), device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    amp = torch.float16 if use_cuda else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)

    # Where to start: a checkpoint holds the epoch, the batches of it already done, the step.
    epoch, done, step = 1, 0, 0
    state = clusterjob.load_checkpoint()
    if state is not None:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        epoch, done, step = state["epoch"], state["done"], state["step"]

    def checkpoint(epoch, done):
        return {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(), "epoch": epoch, "done": done, "step": step}

    while epoch <= args.epochs:
        model.train()
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(train_loader):
            if i < done:  # trained on before the checkpoint
                continue
            x, y = x.to(device), y.to(device)
            with torch.autocast(device.type, dtype=amp):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step += 1
            if step % args.check_every == 0 and clusterjob.should_stop():
                clusterjob.save_checkpoint(checkpoint(epoch, i + 1), step)
                clusterjob.requeue()  # every rank leaves here; the task resumes from the checkpoint
        accuracy = evaluate(model, test_loader, device)
        clusterjob.log(step=step, epoch=epoch, train_loss=loss.item(), val_acc=accuracy)
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}, Accuracy is {100 * accuracy:.2f}%", flush=True)
        epoch, done = epoch + 1, 0
        clusterjob.save_checkpoint(checkpoint(epoch, done), step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
