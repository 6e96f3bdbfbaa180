"""Camera photos (12 MP JPEGs, 4000 x 3000) cropped to 224 for classification: the same project as
``jpeg_classification`` on photos straight from phones and cameras, ``num_workers=4``.

Expected: the loader limits it (each photo takes on the order of 100 ms to decode on one core).
"""

from __future__ import annotations

from pathlib import Path

from jpeg_classification import Classifier, Folder
from torch.utils.data import DataLoader

EXPECTED = {"cpu": "data-bound", "gpu": "data-bound"}
SIZES = {
    "cpu": {"images": 192, "classes": 2, "pixels": (1600, 1200), "batch": 4, "crop": 64, "workers": 2, "steps": 12},
    "gpu": {"images": 768, "classes": 2, "pixels": (4000, 3000), "batch": 32, "crop": 224, "workers": 4,
            "epochs": 40},
}  # fmt: skip


def prepare(root: Path, size: str) -> Path:
    from _images import jpeg_tree

    cfg = SIZES[size]
    return jpeg_tree(Path(root) / f"photos-{cfg['images']}-{cfg['pixels'][0]}", cfg["images"], cfg["classes"],
                     cfg["pixels"])  # fmt: skip


def build(data: Path, size: str):
    cfg = SIZES[size]
    loader = DataLoader(Folder(data, cfg["crop"]), batch_size=cfg["batch"], shuffle=True,
                        num_workers=cfg["workers"], pin_memory=size == "gpu")  # fmt: skip
    # on a GPU, epochs as Lightning's ImageNet example runs them: 24 batches each, every one starting 4 workers again
    length = {"max_epochs": cfg["epochs"]} if "epochs" in cfg else {"max_steps": cfg["steps"]}
    return Classifier(cfg["classes"], size == "gpu"), loader, None, length
