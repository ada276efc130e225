"""What the health watchdog costs a step of the built-in trainer, on CPU.

    python bench/bench_health.py                    # mlp, batch 64, 50 steps a block, 60 rounds, 1 thread
    python bench/bench_health.py --arch convnet --batch 32 --steps 20

One process, in one run: the same built-in trainer step (``trainer.train.train_epoch``
over the tensor pipeline's synthetic CIFAR-shaped batches, DDP over a one-rank gloo
group, so that DDP's gradient all-reduce runs) with health off and on. On: the rank's
beat every step and the timing of its wait for the slowest rank (``Waits``: a tensor
hook and a clock read, in a trainer built while health was on), with the stack handler,
the monitor thread and the watcher process running as the runner starts them. Off: a
trainer built with health off (no hook) and no beat. The watcher and the monitor thread
run through the whole benchmark (started once, as once per session in a run), so blocks
of ``--steps`` steps can alternate off/on (on/off in every other round, so that a drift
of a shared machine falls on both). Printed, on/off: the CPU time of the process per
step (all its threads, the monitor's included: on a shared machine, where other jobs
take the cores away at random, the steadiest measure of what a step costs), and the
wall time per step of the fastest, the median and all blocks; then the CPU time the
watcher process took, as a share of one core. The first round is a warm-up, not counted.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as tdist  # noqa: E402

from clusterjob.core.ranks import DistEnv  # noqa: E402
from clusterjob.core.rundir import create_run  # noqa: E402
from clusterjob.runner import health  # noqa: E402
from clusterjob.spec.schema import dump_spec, spec_from_dict  # noqa: E402
from clusterjob.trainer import pipeline  # noqa: E402
from clusterjob.trainer.device import plan_device  # noqa: E402
from clusterjob.trainer.models import build_model  # noqa: E402
from clusterjob.trainer.train import build_trainer, train_epoch  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="mlp", choices=["convnet", "resnet18", "mlp"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=50, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=60, help="off/on pairs of blocks")
    p.add_argument("--threads", type=int, default=1, help="torch's threads (1: no thread spins on a busy machine)")
    return p.parse_args()


def main() -> int:
    args = parse()
    torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29611"))
    tdist.init_process_group("gloo", rank=0, world_size=1)
    spec = spec_from_dict({
        "name": "bench", "model": {"arch": args.arch},
        "data": {"dataset": "synthetic", "limit_train": args.batch * args.steps, "limit_val": args.batch},
        "train": {"batch_size": args.batch, "amp": "off", "lr_scaling": "none", "log_every": 10**6, "epochs": 1},
        "resources": {"gpus_per_node": 0}})
    env = DistEnv("torchrun", 0, 0, 1, 1, 0, 1, "127.0.0.1", 29611, ("127.0.0.1",))
    plan = plan_device(spec, 0, 1, 1, 0)
    data = pipeline.load_splits(spec.data, spec.train.seed)
    loader = pipeline.build_tensor_loaders(data, spec.data, args.batch, 0, 1, spec.train.seed, plan.device).train_loader
    with tempfile.TemporaryDirectory() as folder:
        run = create_run(Path(folder), "bench", "r1", dump_spec(spec), {})
        trainers = {"off": _trainer(spec, plan, data, loader)}
        watch = health.Health(run, env, spec, "bench").start()
        trainers["on"] = _trainer(spec, plan, data, loader)  # built with health on: it times its waits
        began = time.perf_counter()
        times = _rounds(args, trainers, loader)
        watcher_s = _cpu_s(watch.watcher.pid) if watch.watcher else 0.0
        wall_s = time.perf_counter() - began
        watch.stop()
    tdist.destroy_process_group()
    _print(args, times, watcher_s / wall_s)
    return 0


def _trainer(spec, plan, data, loader):
    torch.manual_seed(0)
    model = build_model(spec.model.arch, data.num_classes, data.in_shape)
    return build_trainer(spec, plan, model, len(loader), world_size=2)  # 2: wrapped in DDP (one rank really)


def _rounds(args, trainers, loader) -> dict:
    """Alternate blocks; health's beat is off (as with ``health: null``) in the off blocks.
    {kind: [(wall s, CPU s) per block]}."""
    times: dict = {"off": [], "on": []}
    beat_path = health._beat_path
    for index in range(args.rounds + 1):
        for kind in ("off", "on") if index % 2 == 0 else ("on", "off"):
            health._beat_path = beat_path if kind == "on" else None
            wall, cpu = time.perf_counter(), time.process_time()
            train_epoch(trainers[kind], loader, 1, lambda *a: None, lambda: False)
            if index:  # the first round warms both up
                times[kind].append((time.perf_counter() - wall, time.process_time() - cpu))
    health._beat_path = beat_path
    return times


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _print(args, times: dict, watcher_share: float) -> None:
    print(f"# bench_health: {args.arch}, batch {args.batch}, {args.steps} steps a block, {args.rounds} rounds; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    print("| per step | off (ms) | on (ms) | on/off |")
    print("| --- | ---: | ---: | ---: |")
    walls = {kind: [wall for wall, _ in blocks] for kind, blocks in times.items()}
    cpus = {kind: sum(cpu for _, cpu in blocks) for kind, blocks in times.items()}
    rows = [("CPU time, all blocks", cpus["off"] / args.rounds, cpus["on"] / args.rounds)]
    rows += [(f"wall time, {name} block", pick(walls["off"]), pick(walls["on"]))
             for name, pick in (("fastest", min), ("median", statistics.median))]
    rows.append(("wall time, all blocks", sum(walls["off"]) / args.rounds, sum(walls["on"]) / args.rounds))
    for name, off, on in rows:
        print(f"| {name} | {1000 * off / args.steps:.3f} | {1000 * on / args.steps:.3f} | {on / off:.4f} |")
    print(f"the watcher process took {100 * watcher_share:.2f}% of one core meanwhile")


if __name__ == "__main__":
    sys.exit(main())
