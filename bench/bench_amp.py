"""The quickstart with ``train.amp: auto`` against ``amp: off``, side by side on this CPU.

    python bench/bench_amp.py                  # 3 rounds of the quickstart, 4 epochs each
    python bench/bench_amp.py --rounds 5 --cpuinfo /tmp/no-bf16   # play a CPU without native bf16
    python bench/bench_amp.py --modes auto off bf16 --epochs 2

Each round runs ``clusterjob submit jobs/quickstart.yaml --executor local --wait`` once
per mode, in an order that rotates from round to round, and reads the run's training
throughput (samples/s of its epochs after the first, from metrics.jsonl) and its wall
time. The ratio of each mode to ``off`` is taken within each round (the same minute, the
same load), and the table gives its median and range over the rounds. The goal:
``auto / off`` >= 0.9 on every CPU (auto is bf16 only where the CPU runs it natively).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clusterjob.core import precision  # noqa: E402


def one_run(mode: str, folder: Path, epochs: int, env: dict) -> dict:
    """One quickstart run in ``folder``: {"amp": what auto chose, "samples_s", "wall_s"}."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "clusterjob", "submit", str(REPO / "jobs" / "quickstart.yaml"),
                           "--executor", "local", "--wait", "--set", f"train.amp={mode}",
                           "--set", f"train.epochs={epochs}", "--set", f"output.root={folder}"],
                          capture_output=True, text=True, env=env, cwd=folder)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"amp {mode}: the quickstart exited {done.returncode}\n{done.stdout}{done.stderr}")
    (run,) = [p for p in (folder / "quickstart").iterdir() if not p.name.startswith(".")]
    epochs_seen = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    later = [e["samples_per_s"] for e in epochs_seen if e.get("epoch", 0) > 1] or \
        [e["samples_per_s"] for e in epochs_seen]
    used = json.loads((run / "run.json").read_text()).get("amp")
    return {"amp": used, "samples_s": statistics.mean(later), "wall_s": wall}


def rounds(modes: list[str], count: int, epochs: int, env: dict) -> list[dict]:
    """``count`` rounds, each mode once, the order rotated by one each round."""
    results = []
    for r in range(count):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        row = {}
        for mode in order:
            with tempfile.TemporaryDirectory(prefix="bench-amp-") as tmp:
                row[mode] = one_run(mode, Path(tmp), epochs, env)
            print(f"round {r + 1} amp {mode} (ran {row[mode]['amp']}): {row[mode]['samples_s']:.0f} samples/s, "
                  f"{row[mode]['wall_s']:.1f} s", file=sys.stderr)
        results.append(row)
    return results


def table(results: list[dict], modes: list[str]) -> list[str]:
    """Markdown rows: per mode, samples/s and wall time (median), and its ratio to off
    within each round (median and range)."""
    lines = ["| amp | ran as | samples/s (median) | wall s (median) | samples/s vs off: median | range |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    for mode in modes:
        runs = [row[mode] for row in results]
        ratios = [row[mode]["samples_s"] / row["off"]["samples_s"] for row in results]
        ran = "/".join(sorted({str(run["amp"]) for run in runs}))
        lines.append(f"| {mode} | {ran} | {statistics.median(r['samples_s'] for r in runs):.0f} | "
                     f"{statistics.median(r['wall_s'] for r in runs):.1f} | {statistics.median(ratios):.3f} | "
                     f"{min(ratios):.3f} to {max(ratios):.3f} |")
    return lines


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.machine()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4, help="the quickstart's own: 4")
    parser.add_argument("--modes", nargs="+", default=["auto", "off"], help="off is always measured")
    parser.add_argument("--cpuinfo", help="a cpuinfo file to read the CPU flags from (CLUSTERJOB_CPUINFO)")
    args = parser.parse_args(argv)
    modes = list(dict.fromkeys([*args.modes, "off"]))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if args.cpuinfo:
        env["CLUSTERJOB_CPUINFO"] = args.cpuinfo
    native = precision.cpu_native_bf16(args.cpuinfo)
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores, native bf16: {native}; "
          f"load average {os.getloadavg()[0]:.1f}")
    for line in table(rounds(modes, args.rounds, args.epochs, env), modes):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
