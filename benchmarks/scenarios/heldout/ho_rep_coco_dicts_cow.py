"""Reported non-leak: shuffled DataLoader workers copy the pages of a list of annotation dicts.

Thread: https://github.com/tier4/autoware-ml/pull/78 ("store annotations in a fork-shared
serialized buffer to stop DataLoader OOM", merged), which applies pytorch/pytorch#13246. A
detection training run was killed by the OOM killer. The PR's diagnosis: the dataset kept its
annotations as ``self.data_infos: list[dict]``; forked DataLoader workers share those pages
copy-on-write, but merely reading a Python object writes its reference count, so every worker
gradually copies the pages of the annotations it reads: each worker ends up with a private copy
of the annotation list. The memory is bounded by the annotations' size per worker; nothing is
kept or leaked, and the fix (as detectron2's ``DatasetFromList``) serializes the annotations into
one shared buffer.

Reproduction: a COCO-style dataset: ``data_infos`` is a list with one dict per image (file name,
size, id, and a list of annotation dicts with a float box, a category, an area and a polygon),
about 4 KB of Python objects per image, one image per training sample. Two persistent workers
read it with ``shuffle=True``: in the first epoch each worker touches half the images and so
nearly every page of the list; ``workers.uss`` rises by about the annotations' size per worker,
then stays flat. A correct verdict is copy-on-write, not a leak. Twin: ``ho_fix_coco_dicts_cow``
(annotations pickled into one numpy buffer with offsets, unpickled per item).
"""

from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .. import Scenario
from .._common import CLASSES, IN_DIM, loader_epochs

SOURCE = "https://github.com/tier4/autoware-ml/pull/78"
BATCH = 64
BOXES_PER_IMAGE = 6

SCENARIO = Scenario(
    name="ho_rep_coco_dicts_cow",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="workers",
    expected_culprit=None,
    description="autoware-ml#78 / pytorch#13246: shuffled workers copy a list-of-dict COCO index",
    expected_kind="copy_on_write",
    workers=True,
    source=SOURCE,
    split="heldout",
    reported=True,
)


def coco_infos(n: int) -> list[dict[str, Any]]:
    rng = random.Random(0)
    infos = []
    for i in range(n):
        anns = []
        for k in range(BOXES_PER_IMAGE):
            x, y = rng.uniform(0, 600), rng.uniform(0, 400)
            w, h = rng.uniform(8, 200), rng.uniform(8, 200)
            anns.append({"id": i * BOXES_PER_IMAGE + k, "image_id": i,
                         "category_id": rng.randrange(CLASSES), "bbox": [x, y, w, h],
                         "area": w * h, "iscrowd": 0,
                         "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]]})
        infos.append({"file_name": f"images/train/{i:012d}.jpg", "height": 480, "width": 640,
                      "id": i, "annotations": anns})
    return infos


class SerializedList:
    """The fix (detectron2's ``DatasetFromList(serialize=True)``): one byte buffer + offsets."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        blobs = [pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL) for x in items]
        self.addr = np.cumsum([len(b) for b in blobs], dtype=np.int64)
        self.buf = np.frombuffer(b"".join(blobs), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.addr)

    def __getitem__(self, i: int) -> dict[str, Any]:
        start = 0 if i == 0 else int(self.addr[i - 1])
        return pickle.loads(self.buf[start:int(self.addr[i])].tobytes())  # type: ignore[no-any-return]


class CocoDetectionDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int, serialize: bool) -> None:
        infos = coco_infos(n)
        self.data_infos: Any = SerializedList(infos) if serialize else infos
        self.table = torch.randn(1024, IN_DIM, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data_infos)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        info = self.data_infos[i]  # reading the dicts writes their refcounts: pages copied
        boxes = torch.tensor([a["bbox"] for a in info["annotations"]])
        label = info["annotations"][0]["category_id"]
        feats = self.table[info["id"] % 1024] + 1e-3 * boxes.mean()
        return feats, torch.tensor(label)


def _run(mw: Any, epochs: int, steps_per_epoch: int, serialize: bool) -> list[list[Any]]:
    ds = CocoDetectionDataset(steps_per_epoch * BATCH, serialize)
    return loader_epochs(mw, epochs, ds, BATCH, shuffle=True)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, serialize=False)
