"""Which torchvision pipelines the GPU decode takes over, and what the workers then send (needs torchvision; the
device has it). The samples keep the CPU transform's draws: the same crops and flips, whatever the placement."""

from __future__ import annotations

import pytest
import torch

tv = pytest.importorskip("torchvision")
from torch.utils.data import default_collate  # noqa: E402
from torchvision import datasets  # noqa: E402
from torchvision import transforms as T  # noqa: E402

from lightning_gpu_boost.core.gpu_decode import BatchDecoder, Share, give_back, recognize, take_over  # noqa: E402
from lightning_gpu_boost.core.images import make_jpeg_folder  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_jpeg_folder(tmp_path_factory.mktemp("jpegs") / "tree", n=16, num_classes=2, progress=False,
                            size_range=(90, 120, 70, 100))  # fmt: skip


def _train(v2: bool = False):
    if v2:
        from torchvision.transforms import v2 as V2

        return V2.Compose([V2.RandomResizedCrop(48), V2.RandomHorizontalFlip(), V2.ToImage(),
                           V2.ToDtype(torch.float32, scale=True), V2.Normalize(MEAN, STD)])  # fmt: skip
    return T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def _val():
    return T.Compose([T.Resize(56), T.CenterCrop(48), T.ToTensor(), T.Normalize(MEAN, STD)])


@pytest.mark.parametrize("make", [_train, lambda: _train(v2=True), _val], ids=["train", "train_v2", "val"])
def test_recognized_pipelines(folder, make):
    plan = recognize(datasets.ImageFolder(str(folder), transform=make()))
    assert plan is not None and plan.size == (48, 48) and plan.mean == MEAN


@pytest.mark.parametrize("why, make", [
    ("another transform", lambda: T.Compose([T.RandomResizedCrop(48), T.ColorJitter(0.2), T.ToTensor(),
                                             T.Normalize(MEAN, STD)])),
    ("no Normalize", lambda: T.Compose([T.RandomResizedCrop(48), T.ToTensor()])),
    ("bicubic", lambda: T.Compose([T.RandomResizedCrop(48, interpolation=T.InterpolationMode.BICUBIC), T.ToTensor(),
                                   T.Normalize(MEAN, STD)])),
    ("size unknown", lambda: T.Compose([T.Resize(56), T.ToTensor(), T.Normalize(MEAN, STD)])),
])  # fmt: skip
def test_pipelines_left_to_the_cpu(folder, why, make):
    assert recognize(datasets.ImageFolder(str(folder), transform=make())) is None, why


def test_a_loader_of_the_users_own_is_left_alone(folder):
    dataset = datasets.ImageFolder(str(folder), transform=_train(), loader=lambda p: datasets.folder.pil_loader(p))
    assert recognize(dataset) is None and take_over(dataset, Share(1.0)) is None


@pytest.mark.parametrize("v2", [False, True])
def test_the_workers_draw_what_the_cpu_transform_draws(folder, v2):
    """Share 0 (the workers decode): the very tensors of the CPU transform, as uint8; share 1: the records' crops
    decode to the same values within the stated tolerance. Both after the same seed: the same draws."""
    plain = datasets.ImageFolder(str(folder), transform=_train(v2))
    torch.manual_seed(7)
    expected = [plain[i][0] for i in range(len(plain))]
    taken = datasets.ImageFolder(str(folder), transform=_train(v2))
    share = Share(0.0)
    assert take_over(taken, share) is not None
    decoder = BatchDecoder(MEAN, STD, device="cpu")
    torch.manual_seed(7)
    by_workers = decoder.images(default_collate([taken[i][0] for i in range(len(taken))]))
    assert decoder.last_share == 0.0
    levels = ((by_workers - torch.stack(expected)) * torch.tensor(STD).view(1, 3, 1, 1) * 255).abs()
    assert levels.max() <= 0.51  # the CPU transform's own pixels, rounded to 8 bits
    share.value = 1.0
    torch.manual_seed(7)
    records = [taken[i][0] for i in range(len(taken))]
    assert all(r.jpeg is not None for r in records)
    on_decoder = decoder.images(default_collate(records))
    levels = ((on_decoder - torch.stack(expected)) * torch.tensor(STD).view(1, 3, 1, 1) * 255).abs()
    assert levels.mean() <= 1.0 and levels.max() <= 4.0
    give_back(taken)
    assert isinstance(taken.transform, (T.Compose, type(_train(v2)))) and taken.loader is datasets.folder.default_loader
    assert taken.transforms.transform is taken.transform


def test_the_validation_pipeline_on_the_decoder(folder):
    plain = datasets.ImageFolder(str(folder), transform=_val())
    taken = datasets.ImageFolder(str(folder), transform=_val())
    take_over(taken, Share(1.0))
    decoder = BatchDecoder(MEAN, STD, device="cpu")
    out = decoder.images(default_collate([taken[i][0] for i in range(len(taken))]))
    levels = ((out - torch.stack([plain[i][0] for i in range(len(plain))])) * torch.tensor(STD).view(1, 3, 1, 1)
              * 255).abs()  # fmt: skip
    assert levels.mean() <= 1.0 and levels.max() <= 4.0


def test_a_fit_with_the_decode_on_the_cpu_device_trains_on_the_same_samples(folder):
    """StreamPrefetch(decode="gpu", cpu_lookahead=True) on a CPU: the user's loader, the decoder on the CPU; the
    model gets every sample once per epoch, normalized floats within the tolerance of the plain run."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from lightning_gpu_boost.callbacks import StreamPrefetch

    seen: dict[str, list] = {}

    class Probe(pl.LightningModule):
        def __init__(self, key):
            super().__init__()
            self.key, self.layer = key, torch.nn.Linear(1, 1)

        def training_step(self, batch, i):
            seen.setdefault(self.key, []).append((batch[0].clone(), batch[1].clone()))
            return self.layer(batch[0].mean().view(1, 1)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    for key, callbacks in (("plain", []), ("decoded", [StreamPrefetch(decode="gpu", cpu_lookahead=True)])):
        pl.seed_everything(3)
        loader = DataLoader(datasets.ImageFolder(str(folder), transform=_train()), batch_size=4, shuffle=True,
                            num_workers=2)  # fmt: skip
        pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks).fit(Probe(key), loader)
        assert isinstance(loader.dataset.transform, T.Compose)  # given back at teardown
    assert len(seen["plain"]) == len(seen["decoded"]) == 8
    for (a, ya), (b, yb) in zip(seen["plain"], seen["decoded"], strict=True):
        assert torch.equal(ya, yb) and a.dtype == b.dtype == torch.float32
        levels = ((a - b) * torch.tensor(STD).view(1, 3, 1, 1) * 255).abs()
        assert levels.mean() <= 1.0 and levels.max() <= 4.0


def test_auto_measures_in_training_and_records_its_placement(folder):
    """StreamPrefetch(decode="auto", cpu_lookahead=True) on a CPU: the split search runs in training (the workers'
    share changes without a restart), decides, and the decision is in the run record and ``decode_placement``;
    the run's facts say that it measures until then (the watchdog holds a host-bound verdict meanwhile); every
    sample is seen once per epoch throughout."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from lightning_gpu_boost.callbacks import StreamPrefetch
    from lightning_gpu_boost.callbacks._data_path import data_path
    from lightning_gpu_boost.callbacks._run_facts import run_facts

    seen: list[list[int]] = []

    class Probe(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def on_train_epoch_start(self):
            seen.append([])

        def training_step(self, batch, i):
            assert batch[0].dtype == torch.float32 and batch[0].shape[1:] == (3, 48, 48)
            seen[-1] += batch[1].tolist()
            return self.layer(batch[0].mean().view(1, 1)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    class Keep(pl.Callback):
        measuring: list[bool] = []

        def on_train_batch_end(self, trainer, *args):
            Keep.measuring.append(run_facts(trainer, None).decode_measuring)

        def on_train_end(self, trainer, pl_module):
            Keep.choice = data_path(trainer).choices.chosen("decode")

    prefetch = StreamPrefetch(decode="auto", cpu_lookahead=True)
    loader = DataLoader(datasets.ImageFolder(str(folder), transform=_train()), batch_size=1, shuffle=True,
                        num_workers=2, persistent_workers=True)  # fmt: skip
    # up to six windows of 24 batches (the split and both ends timed again), 8 of each 16-batch epoch timed after the
    # settle: 18 epochs; 24 leave room for a loaded machine
    pl.Trainer(max_epochs=24, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, callbacks=[prefetch, Keep()]).fit(Probe(), loader)  # fmt: skip
    placement = prefetch.decode_placement
    assert placement is not None and placement["rates"] is not None, placement
    assert 0.0 in placement["rates"] and 1.0 in placement["rates"]
    assert Keep.choice is not None and Keep.choice.by == "StreamPrefetch" and placement["why"] == Keep.choice.why
    assert Keep.measuring[0] and not Keep.measuring[-1], "measuring until the placement is decided, then not"
    labels = sorted(datasets.ImageFolder(str(folder)).targets)
    assert all(sorted(epoch) == labels for epoch in seen), "every sample once per epoch"
    assert isinstance(loader.dataset.transform, T.Compose)


def test_a_failed_fit_gives_the_dataset_back(folder):
    """Lightning calls no teardown after a failed fit: StreamPrefetch's on_exception hands the taken-over dataset
    back, so the user's dataset makes images again, not records."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from lightning_gpu_boost.callbacks import StreamPrefetch

    class Fails(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, i):
            if i == 2:
                raise RuntimeError("the user's step fails")
            return self.layer(batch[0].mean().view(1, 1)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    dataset = datasets.ImageFolder(str(folder), transform=_train())
    loader = DataLoader(dataset, batch_size=2, num_workers=0)
    with pytest.raises(RuntimeError, match="the user's step fails"):
        pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, callbacks=[StreamPrefetch(decode="gpu", cpu_lookahead=True)],
                   ).fit(Fails(), loader)  # fmt: skip
    assert isinstance(dataset.transform, T.Compose)
    image, _ = dataset[0]
    assert isinstance(image, torch.Tensor) and image.dtype == torch.float32
