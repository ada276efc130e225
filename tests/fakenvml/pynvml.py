"""A fake ``pynvml`` (nvidia-ml-py) for tests on machines without a GPU: it answers the
calls clusterjob's GPU sampler makes with the values a script gives.

The script is JSON, in the variable FAKE_NVML (inline) or in the file FAKE_NVML_FILE:

    {"gpus": {"GPU-a": {"util": 90, "mem_mib": 2048, "power_w": 250.5},
              "GPU-b": {"util": 10, "mem_mib": 512, "lost_after": 3}},
     "raise": {"nvmlDeviceGetPowerUsage": "NotSupported"},
     "init": "DriverNotLoaded",
     "hang": ["nvmlInit"]}

- ``gpus``: the machine's GPUs in NVML's index order, each by its UUID: its utilisation
  (%), memory used (MiB) and power (W); ``util`` may be a list, one value per reading
  (the last one repeats); ``lost_after``: the GPU answers that many readings, then
  falls off the bus (NVMLError_GpuIsLost on every call).
- ``raise``: a call that raises the NVMLError of that name on every GPU.
- ``init``: nvmlInit raises that error (no driver).
- ``hang``: calls that never return (a driver that hangs), by name; ``"import"``: the
  import of this module itself.
"""

from __future__ import annotations

import json
import os
import threading
from types import SimpleNamespace

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_GPU_IS_LOST = 15


class NVMLError(Exception):
    def __init__(self, name: str):
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return self.name


def _script() -> dict:
    text = os.environ.get("FAKE_NVML")
    if text is None and os.environ.get("FAKE_NVML_FILE"):
        with open(os.environ["FAKE_NVML_FILE"]) as f:
            text = f.read()
    return json.loads(text or "{}")


_state: dict = {"script": None, "reads": {}}


def _hang(call: str, script: "dict | None") -> None:
    """Never return where the script says ``call`` hangs."""
    if script and call in script.get("hang", []):
        threading.Event().wait()


_hang("import", _script())


def _gpus() -> dict:
    if _state["script"] is None:
        raise NVMLError("Uninitialized")
    return _state["script"].get("gpus", {})


def _check(call: str, uuid: str = "") -> None:
    _hang(call, _state["script"])
    raised = _state["script"].get("raise", {}).get(call) if _state["script"] else None
    if raised:
        raise NVMLError(raised)
    gpu = _gpus().get(uuid, {})
    if "lost_after" in gpu and _state["reads"].get(uuid, 0) >= gpu["lost_after"]:
        raise NVMLError("GpuIsLost")


def nvmlInit() -> None:
    script = _script()
    _hang("nvmlInit", script)
    if script.get("init"):
        raise NVMLError(script["init"])
    _state["script"] = script


def nvmlShutdown() -> None:
    _state["script"] = None


def nvmlDeviceGetCount() -> int:
    _check("nvmlDeviceGetCount")
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> str:
    _check("nvmlDeviceGetHandleByIndex")
    listed = list(_gpus())
    if not 0 <= index < len(listed):
        raise NVMLError("InvalidArgument")
    return listed[index]


def nvmlDeviceGetHandleByUUID(uuid: "bytes | str") -> str:
    _check("nvmlDeviceGetHandleByUUID")
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    if text not in _gpus():
        raise NVMLError("NotFound")
    return text


def nvmlDeviceGetUUID(handle: str) -> str:
    _check("nvmlDeviceGetUUID", handle)
    return handle


def nvmlDeviceGetUtilizationRates(handle: str) -> SimpleNamespace:
    _check("nvmlDeviceGetUtilizationRates", handle)
    util = _gpus()[handle].get("util", 0)
    count = _state["reads"].get(handle, 0)
    _state["reads"][handle] = count + 1
    value = util[min(count, len(util) - 1)] if isinstance(util, list) else util
    return SimpleNamespace(gpu=value, memory=0)


nvmlMemory_v2 = 0x02000028
DRIVER_RESERVED = 512 * 2**20  # what the version-1 reading counts on top of the GPU's processes


def nvmlDeviceGetMemoryInfo(handle: str, version: int = 1) -> SimpleNamespace:
    """Version 2 (``version=nvmlMemory_v2``) as the script says, unless the script has
    ``"memory_v1_only": true``; version 1 counts the driver's reserve as used, as NVML's does."""
    _check("nvmlDeviceGetMemoryInfo", handle)
    used = int(_gpus()[handle].get("mem_mib", 0) * 2**20)
    if version == 1:
        used += DRIVER_RESERVED
    elif _script().get("memory_v1_only"):
        raise NVMLError("FunctionNotFound")
    return SimpleNamespace(used=used, total=80 * 2**30, free=80 * 2**30 - used)


def nvmlDeviceGetPowerUsage(handle: str) -> int:
    _check("nvmlDeviceGetPowerUsage", handle)
    return int(_gpus()[handle].get("power_w", 0) * 1000)
