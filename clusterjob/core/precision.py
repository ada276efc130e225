"""What ``train.amp: auto`` becomes, and why: the one home of that rule.

bf16 autocast pays only where the hardware computes bf16 natively: GPUs of compute
capability 8.0 on (Ampere), and CPUs with AVX512-BF16 or AMX (x86) or the BF16 extension
(Arm). Elsewhere torch emulates it, 6-8x slower than fp32 on a CPU, so auto is fp16 with
loss scaling on older GPUs and off on other CPUs. The rule is pure (the facts are
arguments) so both answers are tested on any machine; ``cpu_native_bf16`` reads this
machine's CPU flags without importing torch, so the submit can say what a local run will
use before any rank starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from clusterjob.core.files import read_text

# Compute capability (major * 10 + minor) from which bf16 runs natively (Ampere, 8.0).
BF16_CAPABILITY = 80
# /proc/cpuinfo flags of CPUs whose bf16 arithmetic is native: x86's AVX512-BF16 and
# AMX-BF16, Arm's BF16 extension ("bf16" in the Features line).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# Where the flags are read; CLUSTERJOB_CPUINFO names another file of the same format (a
# container that hides /proc/cpuinfo, and the tests that play both kinds of CPU).
CPUINFO = "/proc/cpuinfo"
CPUINFO_LIMIT = 4 << 20  # a machine of 1,000 cores writes about 1.5 MiB


@dataclass(frozen=True)
class AmpChoice:
    mode: str   # "fp16", "bf16" or "off"
    why: str    # "" when the spec named the mode; else the reason auto chose it

    def line(self) -> str:
        """The run's first line: ``amp auto -> off (this CPU has no native bf16)``."""
        return f"amp auto -> {self.mode} ({self.why})" if self.why else f"amp {self.mode}"


def choose(amp: str, on_gpu: bool, capability: Optional[int], cpu_bf16: bool) -> AmpChoice:
    """``train.amp`` resolved. ``capability`` is the job's lowest GPU compute capability
    (None: not read yet); ``cpu_bf16`` whether every CPU of the job runs
    bf16 natively."""
    if amp != "auto":
        return AmpChoice(amp, "")
    if on_gpu:
        if capability is None:  # not read yet: the choice that is right on every GPU
            return AmpChoice("fp16", "GPU compute capability unknown: fp16 with loss scaling")
        version = f"{capability // 10}.{capability % 10}"
        if capability >= BF16_CAPABILITY:
            return AmpChoice("bf16", f"GPUs of compute capability {version} run bf16 natively")
        return AmpChoice("fp16", f"compute capability {version} has no native bf16: fp16 with loss scaling")
    if cpu_bf16:
        return AmpChoice("bf16", "this CPU runs bf16 natively")
    return AmpChoice("off", "this CPU has no native bf16")


def cpu_native_bf16(cpuinfo: Optional[str] = None) -> bool:
    """Whether this machine's CPU computes bf16 natively, from its flags. No /proc (macOS)
    or no flag: False, so auto stays with fp32, which is never the slow choice."""
    path = cpuinfo or os.environ.get("CLUSTERJOB_CPUINFO") or CPUINFO
    text, _ = read_text(path, limit=CPUINFO_LIMIT)  # never blocks (a FIFO) nor reads without end
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return any(flag in value.split() for flag in NATIVE_BF16_FLAGS)
    return False


def where_decided(on_gpu: bool) -> str:
    """What a submit says of ``amp: auto`` whose ranks decide it where they start."""
    if on_gpu:
        return "amp auto -> decided where the ranks start (bf16 on GPUs of compute capability >= 8.0, else fp16)"
    return "amp auto -> decided where the ranks start (bf16 where their CPUs run it natively, else off)"


def submit_line(amp: str, on_gpu: bool, ranks_here: bool) -> Optional[str]:
    """What a submit says of ``train.amp`` before the ranks start: for auto on this
    machine's CPU the choice itself, for ranks elsewhere (or on GPUs, whose capability only
    the rank reads) the rule they will apply; nothing for a mode the spec named."""
    if amp != "auto":
        return None
    if ranks_here and not on_gpu:
        return choose(amp, False, None, cpu_native_bf16()).line()
    return where_decided(on_gpu)
