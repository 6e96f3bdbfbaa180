"""Bad samples: a folder with broken files is packed (the broken ones listed, not packed), and a folder read
directly trains with bad_samples="skip" (each broken file dropped, the next samples take its place so batches
stay full, counted per epoch)."""

import tempfile

import lightning.pytorch as pl
import torch

from lightning_gpu_boost.callbacks import BadSampleReport
from lightning_gpu_boost.core.bad_samples import add_broken_files
from lightning_gpu_boost.core.images import make_jpeg_folder
from lightning_gpu_boost.core.lmdb import open_pack, pack_image_folder
from lightning_gpu_boost.datamodules import ImageFolderDataModule


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 4)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return torch.nn.functional.cross_entropy(self.layer(images.float().mean((2, 3))), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    tmp = tempfile.mkdtemp()
    root = make_jpeg_folder(f"{tmp}/src", n=64, num_classes=4, size_range=(64, 96, 48, 80), progress=False)
    broken = add_broken_files(root)  # empty, HTML, random bytes, truncated JPEG and PNG, a dangling link

    pack = open_pack(pack_image_folder(root, f"{tmp}/train.lmdb", progress=False))
    print(f"packed {len(pack)} records; skipped:")
    for entry in pack.meta("bad_samples"):
        print(f"  {entry['path']}: {entry['reason']}")

    dm = ImageFolderDataModule(root, image_size=32, batch_size=16, num_workers=0, bad_samples="skip")
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[BadSampleReport()])  # GPUBoost() includes it  # fmt: skip
    trainer.fit(Tiny(), dm)
    print(f"bad samples skipped in the epoch: {int(trainer.callback_metrics['bad_samples/train'])} of {len(broken)}")
