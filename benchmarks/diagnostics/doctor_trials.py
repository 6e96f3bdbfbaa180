"""Diagnosis: how close the doctor's expected effect of an advised worker count comes to what training then
delivers, from its trial fits (two short fits of the model with the real loader) against its old estimate from the
loader alone (``min(loader alone at the advised count, what the step and the copy take)``).

ResNet-50 bf16 on torchvision's ``ImageFolder`` (float32 batches, pinned by the DataLoader) at ``--workers`` workers:
``diagnose()`` once per round, then separate fits of the same model at the current and the advised count, timed by
the same rule; ``--rounds`` rounds. The figures: each round's expected and measured samples/s and gains, and the
errors ``|measured / expected - 1|`` of both predictions.

    cd benchmarks/diagnostics && python doctor_trials.py --data /tmp/doctor-data
"""

from __future__ import annotations

import argparse

from _common import RESULTS
from torch.utils.data import DataLoader

from lightning_gpu_boost.baselines import plain_image_folder
from lightning_gpu_boost.core.images import make_jpeg_folder
from lightning_gpu_boost.core.results import bar, write_result
from lightning_gpu_boost.doctor import diagnose, measure_fit
from lightning_gpu_boost.models import ImageClassifier


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/tmp/doctor-data")
    parser.add_argument("--images", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    root = make_jpeg_folder(f"{args.data}/jpeg-{args.images}-100", n=args.images, num_classes=100, progress=False)

    def loader(workers: int) -> DataLoader:
        return DataLoader(plain_image_folder(root, 224), batch_size=256, shuffle=True, num_workers=workers,
                          persistent_workers=workers > 0)  # fmt: skip

    model = ImageClassifier("resnet50", 100, channels_last=True)
    rounds = []
    for _ in range(args.rounds):
        d = diagnose(loader(args.workers), model, budget_s=20, steps=10, precision="bf16-mixed")
        advised = d.tuned_workers
        with_copy = 1000 * d.batch_size / (d.step_ms + (d.copy_ms or 0.0))
        estimate = min(d.tuned_samples_per_s or d.loader_samples_per_s, with_copy)  # the loader-alone estimate
        measured = {w: measure_fit(model, loader(w), steps=32, warmup=3, precision="bf16-mixed")["samples_per_s"]
                    for w in (args.workers, advised)}  # fmt: skip
        trial = d.fit_samples_per_s.get(advised)
        rounds.append({
            "advised_workers": advised, "loader_alone": d.loader_samples_per_s,
            "loader_alone_advised": d.tuned_samples_per_s, "trial_fits": d.fit_samples_per_s,
            "estimate_advised": estimate, "measured": measured,
            "trial_error": abs(measured[advised] / trial - 1) if trial else None,
            "estimate_error": abs(measured[advised] / estimate - 1),
            "trial_gain": trial / d.fit_samples_per_s[args.workers] if trial else None,
            "measured_gain": measured[advised] / measured[args.workers],
        })  # fmt: skip
        print(rounds[-1], flush=True)
    worst = max(r["trial_error"] for r in rounds if r["trial_error"] is not None)
    figures = {"rounds": rounds, "trial_error_max": worst,
               "estimate_error_max": max(r["estimate_error"] for r in rounds)}  # fmt: skip
    print(write_result("doctor_trials", figures, {"trial_error_max": bar(worst, 0.25, "ratio", higher_is_better=False)},
                       RESULTS))  # fmt: skip


if __name__ == "__main__":
    main()
