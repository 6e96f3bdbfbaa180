"""The Lightning details ``_lightning.py`` reads that Lightning does not document as public, each checked against the
installed Lightning: if one of these fails after a Lightning upgrade, ``_lightning.py`` is where to look."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from lightning_gpu_boost import _lightning
from lightning_gpu_boost.core.resume import ResumableDataLoader
from tests.helpers import IndexDataset, RecordingModel


def test_the_installed_lightning_is_one_these_details_were_read_from():
    assert _lightning.tested()


def test_a_mid_epoch_resume_says_how_many_batches_of_the_epoch_were_done(tmp_path, trainer_kwargs):
    seen = []

    class Done(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            seen.append(_lightning.batches_done_in_epoch(trainer))

    kwargs = {**trainer_kwargs, "enable_checkpointing": True}
    every = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1,
                                         filename="{step}")  # fmt: skip
    loader = ResumableDataLoader(IndexDataset(24), batch_size=4)  # 6 batches an epoch
    pl.Trainer(max_epochs=2, callbacks=[every, Done()], **kwargs).fit(RecordingModel(), loader)
    for step, done in ((3, 3), (6, 0), (8, 2)):  # mid-epoch, the epoch's last batch (the next starts), mid-epoch
        pl.Trainer(max_epochs=2, callbacks=[Done()], **kwargs).fit(
            RecordingModel(), ResumableDataLoader(IndexDataset(24), batch_size=4),
            ckpt_path=str(tmp_path / "ckpt" / f"step={step}.ckpt"))  # fmt: skip
        assert seen[-1] == done, (step, seen)
    at_end = torch.load(tmp_path / "ckpt" / "step=6.ckpt", weights_only=False)
    mid = torch.load(tmp_path / "ckpt" / "step=3.ckpt", weights_only=False)
    assert len(_lightning.saved_loader_states(mid)) == 1  # the loader's own state, where Lightning keeps it
    at_end["loops"]["fit_loop"]["state_dict"]["combined_loader"] = [{"_iterator_finished": False}]
    assert _lightning.finish_ended_epoch(at_end) == 1 and _lightning.finish_ended_epoch(mid) == 0


def test_the_throughput_utilities_hold_what_peak_flops_reads(trainer_kwargs):
    from lightning.fabric.utilities.throughput import _CUDA_FLOPS
    from lightning.pytorch.callbacks.throughput_monitor import _plugin_to_compute_dtype

    trainer = pl.Trainer(**trainer_kwargs)
    assert "h100 sxm" in _CUDA_FLOPS and torch.bfloat16 in _CUDA_FLOPS["h100 sxm"]
    assert _plugin_to_compute_dtype(trainer.precision_plugin) is torch.float32
    assert _lightning.peak_flops(trainer) is None  # no CUDA device in use
