"""Real workloads, each a small Lightning project written the way its community writes it (plain PyTorch,
torchvision, soundfile, numpy; none imports lightning_gpu_boost), on data it generates.

Each module has:

- ``EXPECTED``: the watchdog's verdict of the plain run, per size, written before the workload was first run;
- ``prepare(root, size) -> Path``: writes its data once (``size`` is ``"cpu"``: seconds on a laptop, for CI, or
  ``"gpu"``: under a minute on the H100 machine);
- ``build(data, size) -> (model, train_loader, val_loader or None, trainer_kwargs)``: the project as its users run
  it (their loader settings included).

``python benchmarks/workloads --size gpu`` runs them (plain, ``GPUBoost()`` as the only change, the ceiling) and
writes ``benchmarks/results/workloads-<date>-<gpu>.json``.
"""

from __future__ import annotations

NAMES = (
    "jpeg_classification",
    "photos_hr",
    "segmentation",
    "audio",
    "tokens_lm",
    "tokens_lm_text",
    "host_bound",
    "tabular",
    "short_epochs",
    "speech_ctc",
    "vit_finetune",
)
