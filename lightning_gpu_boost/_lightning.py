"""Every Lightning detail the package reads that Lightning does not document as public, in one place: the loop's
progress inside an epoch, the layout of a checkpoint's loop state, and the throughput utilities' peak FLOP/s.

Each was read from Lightning 2.5 and 2.6 (:data:`TESTED`) and is tested in ``tests/test_lightning_privates.py``; on
another Lightning each answers as if it found nothing (no batches done, no saved loader state, no peak), and
:func:`tested` says so once, so that a change in Lightning costs a figure or a resume's check, never a wrong batch.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

__all__ = ["TESTED", "batches_done_in_epoch", "finish_ended_epoch", "peak_flops", "saved_loader_states", "tested"]

#: the Lightning versions (major, minor) these details were read from
TESTED = ((2, 5), (2, 6))

# Lightning 2.6's CombinedLoader flattens every loader with torch's LeafSpec, which torch 2.9+ deprecates: a
# FutureWarning from inside Lightning that no user (and no part of ours) can act on, printed by every fit
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)


@functools.cache
def tested() -> bool:
    """Whether the installed Lightning is one of :data:`TESTED` (warns once where it is not)."""
    import lightning

    version = tuple(int(p) for p in lightning.__version__.split(".")[:2] if p.isdigit())
    ok = version in TESTED
    if not ok:
        warnings.warn(f"lightning-gpu-boost reads Lightning {', '.join('.'.join(map(str, v)) for v in TESTED)}; with "
                      f"{lightning.__version__} it leaves out what it cannot read safely (mid-epoch transform draws, "
                      "the ended epoch's saved loader state, MFU).", stacklevel=2)  # fmt: skip
    return ok


def batches_done_in_epoch(trainer: Any) -> int:
    """Training batches of the current epoch already done by a run that resumes mid-epoch (0 otherwise)."""
    if not tested():
        return 0
    loop = trainer.fit_loop
    if not getattr(loop, "restarting", False):
        return 0
    done = int(loop.epoch_loop.batch_progress.current.processed)  # a checkpoint saved inside a step counts it
    total = trainer.num_training_batches
    return 0 if done <= 0 or (isinstance(total, int) and done >= total) else done


def finish_ended_epoch(checkpoint: dict[str, Any]) -> int:
    """Mark the train loaders' saved states as finished where ``checkpoint`` (Lightning's) was saved at an epoch's
    last batch; the number of states changed.

    Lightning resumes such a checkpoint with the next epoch, and gives each train loader that keeps its own state
    the state its iterator had then: at the epoch's last batch, not yet exhausted. torchdata's
    ``StatefulDataLoader`` (0.11) resumes that state inside the ended epoch, whose remainder is empty, and
    Lightning (2.6) takes the empty remainder for the whole next epoch: the next epoch is skipped without a word.
    Marked finished (torchdata's own ``_iterator_finished``), the loader's first iteration is the next epoch, its
    order drawn from the saved generator as the uninterrupted run drew it. Other states are left as they are.
    """
    if not tested():
        return 0
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    if not fit.get("epoch_loop.batch_progress", {}).get("is_last_batch"):
        return 0
    changed = 0
    for state in fit.get("state_dict", {}).get("combined_loader", []) or []:
        if isinstance(state, dict) and state.get("_iterator_finished") is False:
            state["_iterator_finished"] = True
            changed += 1
    return changed


def saved_loader_states(checkpoint: dict[str, Any]) -> list[Any]:
    """The train loaders' own saved states in ``checkpoint`` (Lightning's), in the order Lightning hands it the
    loaders."""
    if not tested():
        return []
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    return list(fit.get("state_dict", {}).get("combined_loader", []) or [])


def peak_flops(trainer: Any) -> float | None:
    """The GPU's dense peak FLOP/s at the precision the step computes in (Lightning's throughput utilities, as its
    ThroughputMonitor reads them), or ``None`` (no CUDA, a chip Lightning does not list). An H200 takes the H100
    SXM's figures: the same tensor cores; Lightning's H200 rows are the datasheet's figures with sparsity (2x), and
    ``torch.cuda.get_device_name`` says only "NVIDIA H200", which they do not match."""
    device = trainer.strategy.root_device
    if device.type != "cuda" or not tested():
        return None
    try:
        import torch
        from lightning.fabric.utilities.throughput import _CUDA_FLOPS, get_available_flops
        from lightning.pytorch.callbacks.throughput_monitor import _plugin_to_compute_dtype

        dtype = _plugin_to_compute_dtype(trainer.precision_plugin)
        if "h200" not in torch.cuda.get_device_name(device).lower():
            return get_available_flops(device, dtype)
        if dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest":
            dtype = "tfloat32"
        return _CUDA_FLOPS["h100 sxm"].get(dtype)
    except Exception:  # a Lightning without them, an unknown chip
        return None
