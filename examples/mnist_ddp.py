"""MNIST with DistributedDataParallel and mixed precision: a plain torchrun-style script.

Nothing here knows about clusterjob. It runs as it is under torchrun, and under
`clusterjob submit jobs/own_script.yaml` (locally or on Slurm), which sets RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for it the same way:

    torchrun --nproc_per_node 2 examples/mnist_ddp.py --epochs 3
    clusterjob submit jobs/own_script.yaml --executor local --wait

The accuracy line it prints after each epoch reaches the run's metrics through the
regex in jobs/own_script.yaml.
"""

import argparse
import os
import shlex

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms


class Net(nn.Module):
    """The two-convolution network of PyTorch's MNIST example."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def parser():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--data", default="./data")
    p.add_argument("--limit", type=int, default=None, help="use only the first N samples of each split")
    p.add_argument("--seed", type=int, default=0)
    return p


def mnist(root, train, limit):
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    try:
        ds = datasets.MNIST(root, train=train, download=True, transform=tf)
    except RuntimeError as err:  # not under root, and no internet here (a compute node)
        fetch = f"clusterjob data fetch mnist --root {shlex.quote(root)}"
        raise RuntimeError(f"MNIST is not under {root} and could not be downloaded; download it (12 MB) where "
                           f"there is internet, e.g. on the login node: {fetch}") from err
    return Subset(ds, range(min(limit, len(ds)))) if limit else ds


def evaluate(model, loader, device):
    model.eval()
    totals = torch.zeros(2, device=device)
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            totals += torch.stack([(model(x).argmax(1) == y).sum().float(), torch.tensor(len(y), device=device)])
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def setup(args):
    """The process group, the data, the model: what every DDP script starts with."""
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    if rank == 0:
        mnist(args.data, True, None)  # download once, before the others read
    dist.barrier()
    train, test = mnist(args.data, True, args.limit), mnist(args.data, False, args.limit)
    sampler = DistributedSampler(train, seed=args.seed)
    torch.manual_seed(args.seed)
    model = DDP(Net().to(device), device_ids=[local_rank] if use_cuda else None)
    amp = torch.float16 if use_cuda else torch.bfloat16
    return argparse.Namespace(
        rank=rank, device=device, sampler=sampler, amp=amp, model=model,
        train_loader=DataLoader(train, batch_size=args.batch_size, sampler=sampler),
        test_loader=DataLoader(test, batch_size=256, sampler=DistributedSampler(test, shuffle=False)),
        optimizer=torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        scaler=torch.amp.GradScaler(device.type, enabled=amp == torch.float16))


def train_step(run, x, y):
    x, y = x.to(run.device), y.to(run.device)
    with torch.autocast(run.device.type, dtype=run.amp):
        loss = F.cross_entropy(run.model(x), y)
    run.optimizer.zero_grad()
    run.scaler.scale(loss).backward()
    run.scaler.step(run.optimizer)
    run.scaler.update()
    return loss


def main():
    args = parser().parse_args()
    run = setup(args)
    for epoch in range(1, args.epochs + 1):
        run.model.train()
        run.sampler.set_epoch(epoch)
        for x, y in run.train_loader:
            loss = train_step(run, x, y)
        accuracy = evaluate(run.model, run.test_loader, run.device)
        if run.rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}, Accuracy is {100 * accuracy:.2f}%", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
