"""Each rank's GPU sampler (docs/design.md, "GPU efficiency"): a thread of the runner,
never of the training loop, reads through NVML (``nvidia-ml-py``, the ``[gpu]`` extra)
every ``health.gpu_sample_s`` the utilisation, memory used and power draw of the GPU
the rank uses, and appends them to ``<run>/telemetry.jsonl`` (clusterjob.health.telemetry).

The rank's GPU is the CUDA device it trains on, found as CUDA finds it: among the
entries of CUDA_VISIBLE_DEVICES (a UUID names its GPU, an index is NVML's; unset: every
GPU NVML counts), the one ``cuda_index`` gives its local rank (the built-in trainer's
rule). Off under ``resources.gpus_per_node: 0`` (the spec means CPU), and off with one
line in the rank's log where no GPU is visible, there is no NVML (the package missing,
no driver), or no rule maps the rank to a GPU. NVML is imported only once a GPU is visible. A GPU whose readings fail
three times in a row (it fell off the bus) is dropped with one line, a power reading
NVML does not give is null; nothing the sampler meets fails the rank.

Nothing the sampler meets holds the rank either: the sampler's thread opens NVML (the
import, nvmlInit) and reads it, each call on a thread of its own awaited
NVML_DEADLINE_S. A driver that does not answer (a hung nvmlInit, a reading that never
returns) holds that one thread: the sampler is dropped with one line in the rank's log,
and the rank trains, ends and is cancelled as if it had none.

On rank 0 the sampler also hands every rank's samples (it follows the file) to the
loggers as system metrics (``listen``): ``system/gpu<rank>_util``, ``_mem_mib`` and
``_power_w``.

``CLUSTERJOB_FAKE_GPUS``, for tests on machines without a GPU only: CUDA_VISIBLE_DEVICES
entries that stand for the node's GPUs in the sampler alone (the training stays as the
spec says), so that a fake NVML module on the path can answer for them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from clusterjob.core.errors import BadInput
from clusterjob.core.files import open_regular
from clusterjob.core.ranks import DistEnv, cuda_index, listed_gpus
from clusterjob.core.rundir import RunDir
from clusterjob.health import telemetry
from clusterjob.health.telemetry import Sample
from clusterjob.spec.schema import Spec

FAKE_GPUS = "CLUSTERJOB_FAKE_GPUS"
FAILURES_TO_DROP = 3  # readings of a GPU that failed in a row: it is gone
CPU = "resources.gpus_per_node is 0 (CPU)"
FOLLOW_MAX_BYTES = 1 << 20  # rank 0 hands the loggers at most this much of the file per sample

_listeners: list = []
_listening = threading.Lock()


def listen(receive: Callable[[list], None]) -> None:
    """``receive`` gets each new list of samples of every rank (rank 0's loggers)."""
    with _listening:
        _listeners.append(receive)


def unlisten(receive: Callable[[list], None]) -> None:
    with _listening:
        with contextlib.suppress(ValueError):
            _listeners.remove(receive)


def _say(rank: int, text: str) -> None:
    print(f"clusterjob: gpu telemetry on rank {rank}: {text}", file=sys.stderr, flush=True)


@dataclass
class Gpu:
    """One GPU the rank uses: NVML's handle, its UUID, failures in a row, whether its
    power reading was found missing already, whether it has only NVML's version-1
    memory reading."""

    handle: Any
    uuid: str
    failures: int = 0
    no_power: bool = False
    v1_memory: bool = False


def visible_entries(spec: Spec) -> tuple[Optional[list], str]:
    """(the CUDA_VISIBLE_DEVICES entries the rank sees, None: every GPU NVML counts; why
    there are none)."""
    fake = os.environ.get(FAKE_GPUS)
    if fake is not None:
        return listed_gpus(fake, None), f"{FAKE_GPUS} lists none"
    if spec.resources.gpus_per_node == 0:
        return [], CPU
    text = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (None, "") if text is None else (listed_gpus(text, None), "no GPU is visible (CUDA_VISIBLE_DEVICES)")


def open_gpus(env: DistEnv, spec: Spec) -> tuple[Any, list, str]:
    """(NVML, the rank's GPUs, "") or (None, [], why the sampler is off)."""
    entries, why = visible_entries(spec)
    if entries == []:
        return None, [], why
    try:
        import pynvml
    except ImportError:
        return None, [], 'nvidia-ml-py is not installed (pip install "clusterjob[gpu]")'
    try:
        pynvml.nvmlInit()
        if entries is None:
            entries = [str(index) for index in range(pynvml.nvmlDeviceGetCount())]
        if not entries:
            return None, [], "NVML sees no GPU"
        entry = entries[cuda_index(env.local_rank, env.local_world_size, len(entries))]
        handle = (pynvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isdigit()
                  else pynvml.nvmlDeviceGetHandleByUUID(entry.encode()))
        uuid = pynvml.nvmlDeviceGetUUID(handle)
    except BadInput as err:
        return None, [], str(err)
    except Exception as err:  # noqa: BLE001 -- NVML's errors (no driver, no such GPU) all mean: no telemetry
        return None, [], f"NVML did not answer ({type(err).__name__}: {err})"
    return pynvml, [Gpu(handle, uuid.decode() if isinstance(uuid, bytes) else str(uuid))], ""


NVML_DEADLINE_S = 30.0  # NVML answers a call in ms, nvmlInit in seconds on a large node; past this it hangs
STOP_WAIT_S = 5.0  # the longest a rank's end waits for its sampler: a second for each NVML call, and more
NO_ANSWER = object()  # what ``Sampler._answered`` gives for a call NVML did not answer


class Sampler:
    """The thread that opens NVML and samples the rank's GPUs every ``period`` seconds
    until ``stop``. Every NVML call (the import, nvmlInit, each reading) runs on a thread
    of its own, awaited NVML_DEADLINE_S: a driver that hangs holds that thread alone,
    never the rank, and the sampler is dropped with one line."""

    def __init__(self, run: RunDir, env: DistEnv, spec: Spec, host: str, period: float, follow: bool):
        self.run, self.env, self.spec, self.host, self.period = run, env, spec, host, period
        self.follow = follow
        self.nvml: Any = None
        self.gpus: list = []
        self.done = threading.Event()
        self.offset: Optional[int] = None  # rank 0 follows the file from here for the loggers
        self.rest = b""
        self.write_failed = False
        self.thread = threading.Thread(target=self._loop, name="clusterjob-gpu", daemon=True)

    def start(self) -> "Sampler":
        self.thread.start()
        return self

    def stop(self) -> None:
        """The thread ends, and NVML is shut down; a call NVML has not answered a second
        after is left to its own thread (the rank does not wait for it)."""
        self.done.set()
        self.thread.join(timeout=STOP_WAIT_S)

    def _loop(self) -> None:
        opened = False
        with contextlib.suppress(Exception):  # a traceback in the rank's log would read as its own
            opened = self._open()
        if not opened:
            return
        while True:
            with contextlib.suppress(Exception):  # nothing the sampler meets may end the rank
                samples = self._answered("a reading", self._read_all)
                if samples is NO_ANSWER:
                    return  # the thread of the reading still waits on NVML: no shutdown either
                self.tick(samples)
            if not self.gpus or self.done.wait(self.period):
                break
        with contextlib.suppress(Exception):
            self._answered("nvmlShutdown", self.nvml.nvmlShutdown)

    def _open(self) -> bool:
        """NVML opened and the rank's GPU found, with the line that says so; False (with
        the line that says why, unless the spec means CPU) where the sampler is off."""
        opened = self._answered("nvmlInit", lambda: open_gpus(self.env, self.spec))
        if opened is NO_ANSWER:
            return False
        self.nvml, self.gpus, why = opened
        if not self.gpus:
            if why != CPU:  # a spec that means CPU expects no GPU: nothing to say
                _say(self.env.rank, f"off: {why}")
            return False
        _say(self.env.rank, f"sampling {', '.join(g.uuid for g in self.gpus)} every {self.period:g} s "
                            f"into {self.run.telemetry_file.name}")
        self.offset = self._size() if self.follow else None
        return True

    def _answered(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()`` run on a thread of its own; NO_ANSWER, with the one line that drops
        the sampler, when it did not return within NVML_DEADLINE_S (a second once
        ``stop`` was asked). What it raises is raised here (NVML's own errors are caught
        inside: this is the unforeseen)."""
        answer: list = []
        returned = threading.Event()

        def run() -> None:
            try:
                answer.append((True, call()))
            except Exception as err:  # noqa: BLE001 -- handed to the sampler's thread, which goes on
                answer.append((False, err))
            returned.set()

        threading.Thread(target=run, name="clusterjob-nvml", daemon=True).start()
        began = time.monotonic()
        deadline = began + NVML_DEADLINE_S
        while not returned.wait(max(0.0, min(0.1, deadline - time.monotonic()))):
            if self.done.is_set():
                deadline = min(deadline, time.monotonic() + 1.0)
            if time.monotonic() >= deadline:
                _say(self.env.rank, f"off: NVML did not answer {what} in {time.monotonic() - began:.0f} s; the "
                                    "sampler is dropped (the run goes on without GPU samples)")
                return NO_ANSWER
        returned_ok, value = answer[0]
        if not returned_ok:
            raise value
        return value

    def _read_all(self) -> list:
        now = time.time()
        return [s for s in (self._read(gpu, now) for gpu in list(self.gpus)) if s is not None]

    def tick(self, samples: list) -> None:
        try:
            telemetry.append(self.run.telemetry_file, samples)
        except OSError as err:
            if not self.write_failed:
                self.write_failed = True
                _say(self.env.rank, f"{self.run.telemetry_file} cannot be written ({err.strerror or err}); "
                                    "samples are lost until it can")
        if self.offset is not None:
            self._follow()

    def _read(self, gpu: Gpu, now: float) -> Optional[Sample]:
        """One reading of ``gpu``; None when NVML failed (the third failure in a row drops it)."""
        try:
            util = float(self.nvml.nvmlDeviceGetUtilizationRates(gpu.handle).gpu)
            mem = float(memory_used(self.nvml, gpu)) / 2**20
        except Exception as err:  # noqa: BLE001 -- a lost GPU raises NVML's own errors
            gpu.failures += 1
            if gpu.failures >= FAILURES_TO_DROP:
                self.gpus.remove(gpu)
                _say(self.env.rank, f"{gpu.uuid} stopped answering ({type(err).__name__}: {err}); no more "
                                    f"samples of it{'' if self.gpus else ', the sampler stops'}")
            return None
        gpu.failures = 0
        return Sample(now, self.env.rank, self.host, gpu.uuid, util, mem, self._power(gpu))

    def _power(self, gpu: Gpu) -> Optional[float]:
        if gpu.no_power:
            return None
        try:
            return float(self.nvml.nvmlDeviceGetPowerUsage(gpu.handle)) / 1000  # mW
        except Exception as err:  # noqa: BLE001 -- NVML has no power reading for MIG slices and some boards
            gpu.no_power = True
            _say(self.env.rank, f"{gpu.uuid} gives no power reading ({type(err).__name__}: {err}); power_w is null")
            return None

    def _size(self) -> int:
        try:
            return os.stat(self.run.telemetry_file).st_size
        except OSError:
            return 0

    def _follow(self) -> None:
        """Every rank's new records to the listeners (rank 0's loggers); none listens
        before the training opened its loggers: the records wait in the file till then."""
        with _listening:
            listeners = list(_listeners)
        if not listeners:
            return
        fd, st, _ = open_regular(self.run.telemetry_file)
        if fd is None or self.offset is None:
            return
        try:
            if st.st_size < self.offset:  # replaced or cut short: from its start
                self.offset, self.rest = 0, b""
            data = os.pread(fd, min(st.st_size - self.offset, FOLLOW_MAX_BYTES), self.offset)
        finally:
            os.close(fd)
        self.offset += len(data)
        *whole, self.rest = (self.rest + data).split(b"\n")
        samples = [s for s in map(telemetry.parse, whole) if s is not None]
        for receive in listeners if samples else []:
            receive(samples)


def start(run: RunDir, env: DistEnv, spec: Spec, host: str) -> Optional[Sampler]:
    """The rank's sampler, started (it opens NVML on its own thread: the rank goes on at
    once); None where the spec samples no GPU."""
    if spec.health is None or spec.health.gpu_sample_s is None:
        return None
    return Sampler(run, env, spec, host, spec.health.gpu_sample_s, env.rank == 0 and spec.logging.any).start()


def memory_used(nvml: Any, gpu: Gpu) -> int:
    """Bytes in use on ``gpu``: NVML's version-2 reading where the driver has it, whose
    ``used`` leaves out the memory the driver reserves for itself (the version-1 reading
    counts it: about half a GiB on an idle H200, not the training's); else version 1."""
    if not gpu.v1_memory and hasattr(nvml, "nvmlMemory_v2"):
        try:
            return int(nvml.nvmlDeviceGetMemoryInfo(gpu.handle, version=nvml.nvmlMemory_v2).used)
        except Exception:  # noqa: BLE001 -- an older driver or binding: NotSupported, FunctionNotFound, TypeError
            gpu.v1_memory = True
    return int(nvml.nvmlDeviceGetMemoryInfo(gpu.handle).used)
