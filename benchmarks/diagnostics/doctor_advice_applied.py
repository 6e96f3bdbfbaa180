"""Diagnosis: `doctor`'s expected effect for the project on its page (docs/doctor.md: 4,000 demo JPEGs through
ImageFolderDataModule at ``num_workers=0``, ResNet-50 bf16 channels_last, batch 256) against fits of that project
plain and with the advice applied (``AutoNumWorkers()``, which reads the count doctor's search left in its cache),
each timed over whole epochs after two of warm-up (``core.steady.whole_epoch_rates``: every epoch's start is in
the figure, as in the run). Run ``lightning-gpu-boost doctor`` on the same data first (its report names the
prediction); ``--predicted`` takes its figure.

    cd benchmarks/diagnostics && python doctor_advice_applied.py --data /tmp/dj --predicted 1851
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import lightning.pytorch as pl
from _common import RESULTS

from lightning_gpu_boost.callbacks import AutoNumWorkers
from lightning_gpu_boost.core.results import write_result
from lightning_gpu_boost.core.steady import whole_epoch_rates
from lightning_gpu_boost.datamodules import ImageFolderDataModule
from lightning_gpu_boost.doctor.measure import _epoch_ends
from lightning_gpu_boost.models import ImageClassifier


def fit(data: str, epochs: int, applied: bool) -> dict[str, Any]:
    clock = _epoch_ends()  # doctor's own clock for its whole-epoch fits
    dm = ImageFolderDataModule(data, batch_size=256, num_workers=0)
    model = ImageClassifier("resnet50", num_classes=10, channels_last=True)
    trainer = pl.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_epochs=epochs, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[clock, *([AutoNumWorkers()] if applied else [])])  # fmt: skip
    trainer.fit(model, datamodule=dm)
    return whole_epoch_rates(clock.ends[2:], clock.samples[2:-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="/tmp/dj")
    parser.add_argument("--predicted", type=float, help="doctor's expected samples/s with its advice applied")
    parser.add_argument("--epochs", type=int, default=10, help="epochs of the applied fit (the plain fit: 4)")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    figures: dict[str, Any] = {"config": vars(args)}
    figures["plain"] = fit(args.data, 4, applied=False)
    print("plain", figures["plain"], flush=True)
    figures["applied"] = fit(args.data, args.epochs, applied=True)
    print("applied", figures["applied"], flush=True)
    figures["measured_gain"] = figures["applied"]["samples_per_s"] / figures["plain"]["samples_per_s"]
    if args.predicted:
        figures["prediction_error"] = abs(figures["applied"]["samples_per_s"] / args.predicted - 1)
    print(f"wrote {write_result('doctor_advice_applied', figures, {}, args.out)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
