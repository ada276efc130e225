"""Runs on the cluster (sent as ``python -c`` source, so that it needs nothing of the
clusterjob installed there): prints what a detached command wrote to its ``.out`` and
``.err`` files from the given offsets on, as frames ``O <n>\\n<n bytes>`` and
``E <n>\\n<n bytes>``, until its ``.rc`` file appears: then ``X <status>\\n``. A quiet
command gets ``H 0\\n`` every few seconds: a follower whose laptop is gone fails to write
it and ends.

A lost connection ends this follower, never the command; the laptop starts a new one
from the offsets it received (``remote/detached.py``).
"""

import os
import sys
import time

HEARTBEAT_S = 5.0


def main(base: str, out_offset: int, err_offset: int) -> int:
    offsets = {"O": out_offset, "E": err_offset}
    paths = {"O": base + ".out", "E": base + ".err"}
    stream = sys.stdout.buffer
    quiet_since = time.monotonic()
    while True:
        done = os.path.exists(base + ".rc")  # before the last read: what came before it is sent
        for key, path in paths.items():
            try:
                with open(path, "rb") as f:
                    f.seek(offsets[key])
                    data = f.read(1 << 20)
            except FileNotFoundError:
                data = b""
            if data:
                stream.write(b"%s %d\n" % (key.encode(), len(data)) + data)
                offsets[key] += len(data)
                done = False  # more may follow in this file
                quiet_since = time.monotonic()
        if time.monotonic() - quiet_since > HEARTBEAT_S:
            stream.write(b"H 0\n")
            quiet_since = time.monotonic()
        stream.flush()
        if done:
            with open(base + ".rc") as f:
                stream.write(b"X %d\n" % int(f.read().strip() or 1))
            stream.flush()
            return 0
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
