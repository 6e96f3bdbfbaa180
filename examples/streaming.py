"""Stream images through litdata with StreamingDataModule (docs/streaming.md).

Writes a small image folder as a litdata stream (the structure check first, then litdata's optimize), then trains
from it with GPUBoost(). A local folder stands in for `s3://bucket/prefix` here; pass `storage_options` (or use the
AWS environment variables) for a remote store.

    python examples/streaming.py
"""

import tempfile

import lightning.pytorch as pl

from lightning_gpu_boost import GPUBoost, recommended_precision
from lightning_gpu_boost.core.images import make_jpeg_folder
from lightning_gpu_boost.core.streaming import write_image_stream
from lightning_gpu_boost.datamodules import StreamingDataModule
from lightning_gpu_boost.models import ImageClassifier

if __name__ == "__main__":
    tmp = tempfile.mkdtemp()
    folder = make_jpeg_folder(f"{tmp}/train", n=64, num_classes=4, size_range=(64, 96, 64, 96), progress=False)
    written = write_image_stream(folder, f"{tmp}/stream", chunk_bytes="64KB", num_workers=1)
    print(f"wrote {written['samples']} samples ({len(written['bad_samples'])} broken files left out)")
    datamodule = StreamingDataModule(f"{tmp}/stream", image_size=32, batch_size=16, num_workers=2,
                                     cache_dir=f"{tmp}/cache")  # fmt: skip
    trainer = pl.Trainer(max_epochs=2, callbacks=[GPUBoost()], precision=recommended_precision(), logger=False,
                         enable_checkpointing=False)  # fmt: skip
    trainer.fit(ImageClassifier("small_cnn", num_classes=4), datamodule=datamodule)
