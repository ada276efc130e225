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

import torch
import torch.distributed as dist
from mnist_ddp import evaluate, parser, setup, train_step

import clusterjob


def settings():
    p = parser()
    p.description = __doc__
    p.add_argument("--check-every", type=int, default=5, help="steps between should_stop() calls")
    args = vars(p.parse_args())
    args.update({k.replace("-", "_"): v for k, v in clusterjob.params.items()})  # the run's params win
    return argparse.Namespace(**args)


def main():
    args = settings()
    run = setup(args)
    model, optimizer, scaler = run.model, run.optimizer, run.scaler

    # Where to start: a checkpoint holds the epoch, the batches of it already done, the step,
    # and the last loss (a stop after an epoch's last batch resumes with none left to train).
    epoch, done, step, loss = 1, 0, 0, torch.tensor(float("nan"))
    state = clusterjob.load_checkpoint()
    if state is not None:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        epoch, done, step, loss = state["epoch"], state["done"], state["step"], state["loss"]

    def checkpoint(epoch, done):
        return {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(), "epoch": epoch, "done": done, "step": step,
                "loss": loss.detach().cpu()}

    while epoch <= args.epochs:
        model.train()
        run.sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(run.train_loader):
            if i < done:  # trained on before the checkpoint
                continue
            loss = train_step(run, x, y)
            step += 1
            if step % args.check_every == 0 and clusterjob.should_stop():
                clusterjob.save_checkpoint(checkpoint(epoch, i + 1), step)
                clusterjob.requeue()  # every rank leaves here; the task resumes from the checkpoint
        accuracy = evaluate(model, run.test_loader, run.device)
        clusterjob.log(step=step, epoch=epoch, train_loss=loss.item(), val_acc=accuracy)
        if run.rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}, Accuracy is {100 * accuracy:.2f}%", flush=True)
        epoch, done = epoch + 1, 0
        clusterjob.save_checkpoint(checkpoint(epoch, done), step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
