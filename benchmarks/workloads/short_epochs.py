"""Short epochs with frequent validation: the ``jpeg_classification`` project on a dataset of a few batches per
epoch, validating every epoch, with the loader settings of Lightning's ImageNet example (4 workers, not persistent)
for training and validation.

Expected: most of the run passes outside the training steps (every epoch starts its workers again, and the
validation loader does the same), which the per-step figures leave out: between-steps.
"""

from __future__ import annotations

from pathlib import Path

from jpeg_classification import SIZES as JPEG
from jpeg_classification import Classifier, Folder
from torch.utils.data import DataLoader

EXPECTED = {"cpu": "between-steps", "gpu": "between-steps"}
SIZES = {
    "cpu": {**JPEG["cpu"], "images": 64, "epochs": 4},
    "gpu": {**JPEG["gpu"], "images": 2048, "epochs": 14},  # 2 warm-up epochs, 12 timed
}


def prepare(root: Path, size: str) -> Path:
    from _images import jpeg_tree

    cfg = SIZES[size]
    return jpeg_tree(Path(root) / f"jpeg-{cfg['images']}", cfg["images"], cfg["classes"], cfg["pixels"])


def build(data: Path, size: str):
    cfg = SIZES[size]
    kwargs = {"batch_size": cfg["batch"], "num_workers": cfg["workers"], "pin_memory": size == "gpu"}
    train = DataLoader(Folder(data, cfg["crop"]), shuffle=True, **kwargs)
    val = DataLoader(Folder(data, cfg["crop"]), **kwargs)
    return Classifier(cfg["classes"], size == "gpu"), train, val, {"max_epochs": cfg["epochs"],
                                                                     "limit_val_batches": 2}  # fmt: skip
