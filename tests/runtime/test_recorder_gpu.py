"""Flight recorder against a real CUDA device: the OOM observer captures the allocator state
before the stack unwinds.

Marked ``gpu``: deselected by default, run with ``pytest -m gpu`` on a machine with a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import memwatch
from memwatch.bundle import find_bundles, open_bundle

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

MiB = 2**20


def test_real_cuda_oom_bundle_shows_the_tensors_alive_at_the_failure(tmp_path: Path) -> None:
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()

    def train() -> None:
        # 64 live 256 MiB blocks in this frame; they are freed when the exception unwinds it.
        held = [torch.empty(256 * MiB, dtype=torch.uint8, device="cuda") for _ in range(64)]
        torch.empty(total * 2, dtype=torch.uint8, device="cuda")  # can never fit
        del held

    with pytest.raises(torch.OutOfMemoryError) as info:
        with memwatch.watch(device="cuda", workers=False, out_dir=tmp_path, signals=False) as mw:
            mw.step()
            train()
    torch.cuda.empty_cache()
    (path,) = [p for p, b in find_bundles(tmp_path / "oom") if not isinstance(b, Exception)]
    assert info.value.memwatch_bundle == path  # type: ignore[attr-defined]
    b = open_bundle(path)
    m = b.manifest
    assert m["pre_unwind"] is True and m["classification"] == "cuda_oom"
    stats = b.read_json("allocator.json")["memory_stats"]
    assert stats["allocated_bytes.all.current"] >= 64 * 256 * MiB
    census = b.read_json("census.json")
    cuda_groups = [g for g in census["groups"] if str(g["device"]).startswith("cuda")]
    assert cuda_groups and cuda_groups[0]["count"] == 64
    assert cuda_groups[0]["bytes"] == 64 * 256 * MiB
    snap = b.snapshot()
    live = sum(blk["size"] for seg in snap["segments"] for blk in seg["blocks"]
               if blk["state"] == "active_allocated")
    assert live >= 64 * 256 * MiB
    exc = b.read_json("exception.json")
    assert exc["numbers"]["tried_to_allocate"] >= total  # parsed from the real message
    assert m["write_seconds"] < 10
