"""Diagnosis: where GPU time goes in a DALI training step vs the ceiling step (torch.profiler, CUDA kernels).

    python benchmarks/dali_profile.py --out /tmp/profile

Prints and writes the top CUDA kernels by total time over ``--steps`` profiled steps of each case.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch
from _common import demo_tree, parser_for
from torch.profiler import ProfilerActivity, profile

from lightning_gpu_boost.core.doctor import ResidentBatches
from lightning_gpu_boost.datamodules.dali import DALIDataModule
from lightning_gpu_boost.models import ImageClassifier


class Profile(pl.Callback):
    def __init__(self, start: int, steps: int) -> None:
        self.start, self.steps, self.prof = start, steps, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.start:
            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.prof.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.prof is not None and trainer.global_step == self.start + self.steps:
            torch.cuda.synchronize()
            self.prof.__exit__(None, None, None)
            self.table = self.prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
            self.prof = None


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    root = demo_tree(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    x = torch.randn(args.batch_size, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    cases = {
        "ceiling": ResidentBatches((x.contiguous(memory_format=torch.channels_last),
                                    torch.randint(0, 100, (args.batch_size,), device="cuda")), 10_000),
        "dali_folder": DALIDataModule(str(root), batch_size=args.batch_size, dtype="bfloat16", channels_last=True),
    }  # fmt: skip
    for name, data in cases.items():
        callback = Profile(start=15, steps=args.steps)
        trainer = pl.Trainer(max_steps=15 + args.steps + 2, precision="bf16-mixed", logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[callback])  # fmt: skip
        model = ImageClassifier("resnet50", num_classes=100, channels_last=True)
        if isinstance(data, pl.LightningDataModule):
            trainer.fit(model, datamodule=data)
        else:
            trainer.fit(model, data)
        (out / f"profile-{name}.txt").write_text(callback.table)
        print(f"== {name}\n{callback.table}")


if __name__ == "__main__":
    main()
