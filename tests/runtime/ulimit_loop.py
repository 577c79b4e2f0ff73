"""A loop that leaks 2 MiB a step under an address-space limit (``ulimit -v``) until it dies;
every check's findings are appended to OUT_JSONL as they come (the process does not survive).

Usage: python ulimit_loop.py OUT_JSONL ROOM_MIB
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile

out_path, room_mib = sys.argv[1], int(sys.argv[2])
MIB = 1 << 20
kept: list = []


def vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


def main() -> None:
    import numpy as np

    import memwatch

    with memwatch.watch(device="cpu", workers=False, out_dir=tempfile.mkdtemp(),
                        check_every_n_steps=32, check_every_s=None, warn=False,
                        recorder=False) as mw:
        mw.step()  # the session's own threads and buffers exist before the limit is set
        limit = vm_size() + room_mib * MIB
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        seen, step = 0, 1
        with open(out_path, "a") as out:
            while True:
                try:
                    kept.append(np.ones(2 * MIB // 8))
                except MemoryError:
                    out.write(json.dumps({"died_at": step}) + "\n")
                    return
                mw.step()
                step += 1
                if mw.checks > seen:
                    for f in mw.findings:
                        if f.check == seen and f.kind == "leak":
                            out.write(json.dumps({"step": f.step, "steps_to_oom": f.steps_to_oom,
                                                  "message": f.message}) + "\n")
                    out.flush()
                    seen = mw.checks


main()
