"""SpanEpochs: short-epoch loaders are wrapped in SpanningLoader inside a real Trainer; the rest are left alone."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_gpu_boost.callbacks import GPUBoost, SpanEpochs
from lightning_gpu_boost.core.spanning import SpanningLoader, restart_share, span_decision
from tests.helpers import IndexDataset, RecordingModel, run_ddp


def _spanned(trainer: pl.Trainer) -> tuple[bool, list[bool]]:
    train = trainer.fit_loop._combined_loader.flattened
    combined = trainer.fit_loop.epoch_loop.val_loop._combined_loader
    val = [] if combined is None else combined.flattened
    spans = [isinstance(x, SpanningLoader) and x.span for x in (train[0], *val)]  # span=False: resumable only
    return spans[0], spans[1:]


def test_short_epochs_are_spanned_every_sample_once_and_validation_loads_only_its_batches(trainer_kwargs):
    model, span = RecordingModel(), SpanEpochs()
    train = DataLoader(IndexDataset(24), batch_size=4, shuffle=True, num_workers=2)
    val = DataLoader(IndexDataset(24), batch_size=4, num_workers=2)
    trainer = pl.Trainer(max_epochs=3, limit_val_batches=2, num_sanity_val_steps=0, callbacks=[span], **trainer_kwargs)
    trainer.fit(model, train, val)
    assert _spanned(trainer) == (True, [True])
    val_loader = trainer.fit_loop.epoch_loop.val_loop._combined_loader.flattened[0]
    assert val_loader.batches_per_epoch == 2  # limit_val_batches: the workers load only those
    for epoch in range(3):
        assert sorted(i for b in model.seen["train"][6 * epoch : 6 * epoch + 6] for i in b) == list(range(24))
    assert model.seen["val"] == [[0, 1, 2, 3], [4, 5, 6, 7]] * 3
    assert [d[:2] for d in span.decisions] == [("train", True), ("val", True)]
    assert trainer.fit_loop._combined_loader.flattened[0]._iterator is None  # teardown stopped the workers
    assert val_loader._iterator is None


def test_a_seeded_run_draws_the_same_new_order_each_epoch(trainer_kwargs):
    def run():
        pl.seed_everything(3)
        model = RecordingModel()
        loader = DataLoader(IndexDataset(24), batch_size=4, shuffle=True, num_workers=2)
        pl.Trainer(max_epochs=3, callbacks=[SpanEpochs()], **trainer_kwargs).fit(model, loader)
        return [sum(model.seen["train"][6 * e : 6 * e + 6], []) for e in range(3)]

    # one iterator draws the workers' seed once (a plain loader draws it per epoch from the same global generator),
    # so the orders are not a plain run's, but they are reproducible and new each epoch
    first = run()
    assert first == run() and len({tuple(e) for e in first}) == 3
    assert all(sorted(e) == list(range(24)) for e in first)


@pytest.mark.parametrize(
    ("loader", "kwargs", "why"),
    [
        (DataLoader(IndexDataset(400), batch_size=4, num_workers=1), {}, "below 5%"),  # 100 batches, 1 worker
        (DataLoader(IndexDataset(24), batch_size=4), {}, "no workers"),
        (DataLoader(type("Epochs", (IndexDataset,), {"set_epoch": lambda self, e: None})(24), batch_size=4,
                    num_workers=2), {}, "set_epoch"),  # fmt: skip
    ],
)
def test_loaders_it_leaves_alone_and_why(trainer_kwargs, loader, kwargs, why):
    span = SpanEpochs(**kwargs)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=100, callbacks=[span], **trainer_kwargs)
    trainer.fit(RecordingModel(), loader)
    assert _spanned(trainer)[0] is False
    assert span.decisions[0][1] is False and why in span.decisions[0][2]


def test_reloaded_loaders_and_switched_off_stages_are_left_alone(trainer_kwargs):
    loader = DataLoader(IndexDataset(24), batch_size=4, num_workers=2)
    span = SpanEpochs()
    trainer = pl.Trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, callbacks=[span], **trainer_kwargs)
    trainer.fit(RecordingModel(), loader)
    assert span.decisions == [] and _spanned(trainer)[0] is False
    span = SpanEpochs(train=False)
    trainer = pl.Trainer(max_epochs=1, limit_val_batches=2, callbacks=[span], **trainer_kwargs)
    trainer.fit(RecordingModel(), loader, DataLoader(IndexDataset(24), batch_size=4, num_workers=2))
    assert _spanned(trainer) == (False, [True])


def test_an_int_limit_train_batches_sets_the_epoch_it_spans_a_fraction_is_left_alone(trainer_kwargs):
    model, span = RecordingModel(), SpanEpochs()
    trainer = pl.Trainer(max_epochs=2, limit_train_batches=4, callbacks=[span], **trainer_kwargs)
    trainer.fit(model, DataLoader(IndexDataset(32), batch_size=4, num_workers=2))
    assert trainer.fit_loop._combined_loader.flattened[0].batches_per_epoch == 4
    assert model.seen["train"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]] * 2
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=0.5, callbacks=[span], **trainer_kwargs)
    trainer.fit(RecordingModel(), DataLoader(IndexDataset(32), batch_size=4, num_workers=2))
    assert _spanned(trainer)[0] is False and "fraction" in span.decisions[0][2]


def test_gpu_boost_spans_short_epochs_unless_told_not_to(trainer_kwargs):
    for span_epochs, expected in ((True, True), (False, False)):
        boost = GPUBoost(span_epochs=span_epochs, auto_workers=False, watchdog=False)
        trainer = pl.Trainer(max_epochs=1, callbacks=[boost], **trainer_kwargs)
        trainer.fit(RecordingModel(), DataLoader(IndexDataset(24), batch_size=4, num_workers=2))
        assert _spanned(trainer)[0] is expected
        assert ("span_epochs" in boost.parts) is expected


def test_the_estimate_and_the_decision():
    assert restart_share(0, 4) == 0.0 and restart_share(8, 0) == 0.0
    assert restart_share(12, 4) == pytest.approx(0.25)
    short = DataLoader(IndexDataset(32), batch_size=4, num_workers=2)
    assert span_decision(short, None)[0] and "8 batches per epoch, 2 workers" in span_decision(short, None)[1]
    assert span_decision(short, 1000)[0] is False
    assert span_decision(short, 1000, min_share=0.0)[0] is True
    assert span_decision([1, 2], None) == (False, "a list, not a DataLoader")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"min_restart_share": 1.0}, "min_restart_share"), ({"train": "yes"}, "train"), ({"val": 1}, "val")],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SpanEpochs(**kwargs)


def test_ddp_each_rank_spans_its_shard_exactly_once_per_epoch(tmp_path):
    results = run_ddp(
        """
        import lightning.pytorch as pl
        from torch.utils.data import DataLoader
        from lightning_gpu_boost.callbacks import SpanEpochs
        from lightning_gpu_boost.core.spanning import SpanningLoader
        pl.seed_everything(1)
        model = RecordingModel()
        trainer = pl.Trainer(accelerator="cpu", devices=NPROCS, strategy="ddp", max_epochs=2, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[SpanEpochs()])
        trainer.fit(model, DataLoader(IndexDataset(32), batch_size=4, shuffle=True, num_workers=1))
        spanned = isinstance(trainer.fit_loop._combined_loader.flattened[0], SpanningLoader)
        epochs = [sum(model.seen["train"][:4], []), sum(model.seen["train"][4:], [])]
        (OUT / f"rank{trainer.global_rank}.json").write_text(json.dumps({"spanned": spanned, "epochs": epochs}))
        """,
        tmp_path,
    )
    assert all(r["spanned"] for r in results)
    for epoch in (0, 1):
        shards = [set(r["epochs"][epoch]) for r in results]
        assert shards[0].isdisjoint(shards[1]) and shards[0] | shards[1] == set(range(32))
    assert results[0]["epochs"][0] != results[0]["epochs"][1]  # each epoch its own order


@pytest.mark.gpu
def test_uint8_images_moved_to_the_gpu_are_normalized_through_a_spanning_loader(tmp_path):
    from torchvision import transforms

    class Images(torch.utils.data.Dataset):
        def __init__(self):
            self.transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.25] * 3)])

        def __len__(self):
            return 16

        def __getitem__(self, i):
            from PIL import Image

            return self.transform(Image.new("RGB", (8, 8), (255, 255, 255))), i

    class Check(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 2)
            self.values: list[float] = []

        def training_step(self, batch, batch_idx):
            self.values.append(float(batch[0].float().mean()))
            return self.layer(batch[0].float().mean((2, 3))).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    model = Check()
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                         callbacks=[GPUBoost(auto_workers=False, watchdog=False)])  # fmt: skip
    trainer.fit(model, DataLoader(Images(), batch_size=4, num_workers=2))
    assert isinstance(trainer.fit_loop._combined_loader.flattened[0].loader, SpanningLoader)
    assert model.values == pytest.approx([2.0] * 8)  # (1 - 0.5) / 0.25: normalized once, on the GPU


def test_a_fit_that_shows_spanning_was_wrongly_left_off_makes_span_epochs_decide_again(trainer_kwargs):
    """One voice: SpanEpochs chose not to span (its threshold), the run then passed most of its time outside the
    steps: the watchdog does not advise SpanEpochs a threshold; SpanEpochs decides again, and the next fit spans."""
    from lightning_gpu_boost.callbacks import GPUUtilWatchdog
    from lightning_gpu_boost.core.run_record import run_record

    span = SpanEpochs(val=False, min_restart_share=0.99)  # an estimate of a few % is below it: not spanned
    dog = GPUUtilWatchdog(window=2, warmup_steps=0, summary=False)
    train = DataLoader(IndexDataset(16), batch_size=4, num_workers=2, persistent_workers=False)
    trainer = pl.Trainer(callbacks=[span, dog], max_epochs=4, **trainer_kwargs)
    with pytest.warns(UserWarning, match="outside the steps"):
        trainer.fit(RecordingModel(), train)
    assert span.decisions[0][:2] == ("train", False) and dog.run_verdict == "between-steps", dog.summaries
    message = next(w["message"] for w in dog.warnings if w["verdict"] == "between-steps")
    assert "SpanEpochs decided again" in message and "min_restart_share" not in message
    assert run_record(trainer).changes[0]["setting"] == "span_epochs"
    trainer = pl.Trainer(callbacks=[span], max_epochs=1, **trainer_kwargs)
    trainer.fit(RecordingModel(), DataLoader(IndexDataset(16), batch_size=4, num_workers=2))
    assert span.decisions[0][:2] == ("train", True)  # the next fit spans it
