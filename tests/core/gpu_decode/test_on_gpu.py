"""The GPU decode on CUDA: the values nvJPEG's path hands the model against the CPU transform's (the tolerance
docs/gpu_decode.md states), the same accuracy on a learnable image task, and ``decode="auto"`` deciding."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return pytest.importorskip("torchvision")


@pytest.mark.parametrize("gpu_decoder", ["engines", "nvjpeg", "dali", "dali_cuda_decoder"])
def test_gpu_values_within_the_stated_tolerance_of_the_cpu_transform(tmp_path, gpu_decoder):
    tv = _need_cuda()
    if gpu_decoder == "engines":
        pytest.importorskip("nvidia.nvimgcodec", reason="nvImageCodec is not installed")
    if gpu_decoder.startswith("dali"):
        pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from torch.utils.data import default_collate
    from torchvision import datasets
    from torchvision import transforms as T

    from lightning_gpu_boost.core.gpu_decode import BatchDecoder, Share, take_over
    from lightning_gpu_boost.core.images import make_jpeg_folder

    root = make_jpeg_folder(tmp_path / "tree", n=256, num_classes=4, progress=False)
    stats = {}
    for name, transform in (
        ("train", lambda: T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                                     T.Normalize(MEAN, STD)])),
        ("val", lambda: T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])),
    ):  # fmt: skip
        plain = datasets.ImageFolder(str(root), transform=transform())
        torch.manual_seed(0)
        expected = torch.stack([plain[i][0] for i in range(len(plain))])
        taken = datasets.ImageFolder(str(root), transform=transform())
        take_over(taken, Share(1.0))
        torch.manual_seed(0)
        decoder = BatchDecoder(MEAN, STD, device="cuda", engines=gpu_decoder == "engines",
                               dali=gpu_decoder.startswith("dali"))  # fmt: skip
        if gpu_decoder == "dali_cuda_decoder":  # the engines' share 0, as DecoderChoice may keep
            decoder.engine_load = 0.0
        records = default_collate([taken[i][0] for i in range(len(taken))])
        if gpu_decoder.startswith("dali"):  # handed over at the fetch, taken at the hand-out: as the prefetcher does
            got = decoder.end(decoder.begin([records]))[0].cpu()
        else:
            got = decoder.images(records).cpu()
        assert decoder.decoded_on_gpu == len(taken)
        prefix = {"engines": "the GPU's JPEG engines", "nvjpeg": "nvJPEG", "dali": "DALI (the JPEG engines",
                  "dali_cuda_decoder": "DALI (nvJPEG's CUDA decoder"}[gpu_decoder]  # fmt: skip
        assert decoder.decoder_name.startswith(prefix), decoder.decoder_name
        levels = ((got - expected) * torch.tensor(STD).view(1, 3, 1, 1) * 255).abs()
        stats[name] = {"mean_levels": float(levels.mean()), "max_levels": float(levels.max()),
                       "p999_levels": float(levels.flatten().kthvalue(int(0.999 * levels.numel())).values)}  # fmt: skip
    print(f"GPU decode ({decoder.decoder_name}) vs CPU transform, 8-bit levels:", json.dumps(stats), tv.__version__)
    if os.environ.get("LGB_PARITY_OUT"):
        with open(f"{os.environ['LGB_PARITY_OUT']}.{gpu_decoder}.json", "w") as f:
            json.dump(stats, f)
    for name, s in stats.items():  # the tolerance docs/gpu_decode.md states
        assert s["mean_levels"] <= 1.5 and s["max_levels"] <= 32.0, (name, s)


def _learnable_tree(root, n_per_class: int = 96):
    """4 classes told apart by a coloured stripe's position, with noise: learnable, not trivial."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(4):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True)
        for i in range(n_per_class):
            h, w = rng.integers(90, 140), rng.integers(90, 140)
            img = rng.normal(110, 40, (h, w, 3))
            top = int(c * h / 4)
            img[top: top + h // 4, :, rng.integers(0, 3)] += 90
            Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(folder / f"{i}.jpg", quality=90)
    return root


def test_the_same_accuracy_with_cpu_and_gpu_decode(tmp_path):
    _need_cuda()
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader
    from torchvision import datasets
    from torchvision import transforms as T

    from lightning_gpu_boost.callbacks import StreamPrefetch

    root = _learnable_tree(tmp_path / "tree")

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, stride=2),
                torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d((4, 1)), torch.nn.Flatten(), torch.nn.Linear(128, 4))
            self.correct = self.total = 0
            self.on_default_stream = set()

        def training_step(self, batch, i):
            self.on_default_stream.add(torch.cuda.current_stream() == torch.cuda.default_stream())
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def validation_step(self, batch, i):
            self.correct += int((self.net(batch[0]).argmax(1) == batch[1]).sum())
            self.total += len(batch[1])

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=3e-3)

    accuracy, windows, streams = {}, {}, {}
    for decode in ("cpu", "gpu"):
        pl.seed_everything(0)
        train = DataLoader(datasets.ImageFolder(str(root), transform=T.Compose([
            T.RandomResizedCrop(64, scale=(0.6, 1.0)), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)
        ])), batch_size=32, shuffle=True, num_workers=2)  # fmt: skip
        val = DataLoader(datasets.ImageFolder(str(root), transform=T.Compose([
            T.Resize(72), T.CenterCrop(64), T.ToTensor(), T.Normalize(MEAN, STD)])), batch_size=64, num_workers=2)
        model, prefetch = Net(), StreamPrefetch(decode=decode)
        pl.Trainer(accelerator="gpu", devices=1, max_epochs=6, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                   check_val_every_n_epoch=6, callbacks=[prefetch]).fit(model, train, val)  # fmt: skip
        accuracy[decode] = model.correct / model.total
        windows[decode] = (prefetch.decode_placement or {}).get("backward_window")
        streams[decode] = model.on_default_stream
        assert torch.cuda.current_stream() == torch.cuda.default_stream()  # given back after the fit
    print("accuracy by decode:", accuracy, "the hand-over thread's window:", windows)
    if "DALI" in " ".join(prefetch.decode_placement["gpu_decoder"] or ()):  # DALI's batches began in backward
        assert windows["gpu"]["waits"] > 0 and windows["gpu"]["off"] == "training ended", windows
        assert streams["gpu"] == {False} and prefetch.decode_placement["train_stream"]["used"]
    assert streams["cpu"] == {True}, streams  # the CPU decode leaves the training's stream as it is
    assert min(accuracy.values()) >= 0.8 and abs(accuracy["cpu"] - accuracy["gpu"]) <= 0.06, accuracy


def test_auto_decides_and_says_why(tmp_path):
    _need_cuda()
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader
    from torchvision import datasets
    from torchvision import transforms as T

    from lightning_gpu_boost.callbacks import GPUBoost
    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.models import ImageClassifier

    root = make_jpeg_folder(tmp_path / "tree", n=4096, num_classes=4, progress=False)
    loader = DataLoader(datasets.ImageFolder(str(root), transform=T.Compose([
        T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])),
        batch_size=64, shuffle=True)  # fmt: skip
    boost = GPUBoost(workers_budget_s=3.0, watchdog=False)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=8, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, precision="bf16-mixed",
                         callbacks=[boost])  # fmt: skip
    stage = boost.parts["prefetch"]
    seen = {}

    class Keep(pl.Callback):
        def on_train_end(self, trainer, pl_module):
            seen["search"] = stage.gpu_decode.search
            seen["choice"] = trainer.strategy

    trainer.callbacks.append(Keep())
    trainer.fit(ImageClassifier("resnet18", 4), loader)
    search = seen["search"]
    assert search.decision is not None, search.rates
    assert search.decision.share in search.decision.rates and search.decision.why
    assert search.decision.rates[search.decision.share] >= search.decision.rates[0.0]
    assert isinstance(loader.dataset.transform, T.Compose)


@pytest.mark.parametrize("handover_thread", [False, True])
def test_the_prefetcher_hands_batches_to_dali_at_the_fetch(tmp_path, monkeypatch, handover_thread):
    """On CUDA with DALI: each batch is begun when fetched and ended when handed out, two ahead (in the training
    thread, or in a thread of its own); the batches come in order with the values of the per-image path; a loop
    stopped early leaves nothing in flight."""
    _need_cuda()
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from torch.utils.data import DataLoader
    from torchvision import datasets
    from torchvision import transforms as T

    from lightning_gpu_boost.core.gpu_decode import BatchDecoder, Share, take_over
    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.prefetch import StreamPrefetcher

    monkeypatch.setattr(StreamPrefetcher, "_handover_thread", handover_thread)

    root = make_jpeg_folder(tmp_path / "tree", n=96, num_classes=4, progress=False)
    transform = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])
    dataset = datasets.ImageFolder(str(root), transform=transform)
    take_over(dataset, Share(1.0))
    loader = DataLoader(dataset, batch_size=16, num_workers=2)
    per_image = StreamPrefetcher(loader, decode=BatchDecoder(MEAN, STD, device="cuda", dali=False))
    expected = [(x.cpu(), y.cpu()) for x, y in per_image]
    decoder = BatchDecoder(MEAN, STD, device="cuda")
    got = [(x.cpu(), y.cpu()) for x, y in StreamPrefetcher(loader, decode=decoder)]
    assert "DALI" in decoder.decoder_name and len(got) == len(expected) == 6
    assert (decoder.handed_out is not None) == handover_thread  # the facts of the batch handed out, not the next
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert torch.equal(y, ey)
        levels = ((x - ex) * torch.tensor(STD).view(1, 3, 1, 1) * 255).abs()
        assert levels.mean() <= 1.5 and levels.max() <= 32.0
    for k, _ in enumerate(StreamPrefetcher(loader, decode=decoder)):
        if k == 1:
            break
    assert not decoder._dali._fed and not decoder._dali._waiting
    again = [y.cpu() for _, y in StreamPrefetcher(loader, decode=decoder)]
    assert [y.tolist() for y in again] == [ey.tolist() for _, ey in expected]
    if handover_thread:  # a window that never opens holds each batch up a while, then stays open: the same batches
        from lightning_gpu_boost.core.handover import BackwardWindow

        window = BackwardWindow(timeout_s=0.01, misses=2)
        window.close()
        gated = []
        for _, y in StreamPrefetcher(loader, decode=decoder, window=window):  # a slow step: a finished batch waits
            gated.append(y.cpu())
            time.sleep(0.05)
        assert [y.tolist() for y in gated] == [ey.tolist() for _, ey in expected]
        assert window.figures()["timeouts"] == 2 and window.off is not None


@pytest.mark.parametrize("pipes", [2, 3])
def test_dalis_images_are_right_while_the_reading_stream_lags(pipes):
    """The images are copied out of DALI's buffers and a pipeline is fed again only once the copy is done: with the
    reading stream held up before each read, and later batches decoded meanwhile, every batch's images are its own
    JPEGs' crops, resized. (DALI's buffers taken through DLPack, as its PyTorch plugin takes them, failed this on
    the H200 from the sixth batch: the reads came after DALI had written the next batch there.)"""
    _need_cuda()
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    import io

    from PIL import Image

    from lightning_gpu_boost.core.gpu_decode.dali_windows import DaliWindows
    from lightning_gpu_boost.core.gpu_decode.plan import geometry

    def jpeg(seed: int) -> bytes:  # smooth, as photographs are: decoders differ little on it
        buf = io.BytesIO()
        y, x = np.mgrid[0:80, 0:96]
        phase = np.random.default_rng(seed).uniform(0, 6.28, 3)
        pixels = np.stack([127 + 100 * np.sin(x / 15 + y / 23 + p) for p in phase], -1).astype(np.uint8)
        Image.fromarray(pixels).save(buf, "JPEG", quality=90)
        return buf.getvalue()

    data = [[jpeg(10 * b + s) for s in range(4)] for b in range(8)]
    windows = [(3, 5, 60, 70), (10, 20, 20, 24), (0, 0, 80, 96), (1, 2, 30, 40)]
    shapes = [geometry(80, 96, [("crop", *w), ("resize", 32, 32)]) for w in windows]
    geometries = np.array([[*g[0], *g[1], int(g[2])] for g in shapes])

    def rows(jpegs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        out = np.zeros((len(jpegs), max(map(len, jpegs))), np.uint8)
        for k, d in enumerate(jpegs):
            out[k, : len(d)] = np.frombuffer(d, np.uint8)
        return out, np.array([len(d) for d in jpegs])

    dali = DaliWindows("cuda", threads=2, pipes=pipes)
    side, out = torch.cuda.Stream(), []
    with torch.cuda.stream(side):
        tickets = [dali.submit(*rows(data[b]), geometries) for b in range(pipes)]
        for b in range(len(data)):
            torch.cuda._sleep(20_000_000)  # the reads below wait on the GPU while later batches are decoded
            out.append(dali.collect(tickets[b]).clone())
            if b + pipes < len(data):
                tickets.append(dali.submit(*rows(data[b + pipes]), geometries))
    torch.cuda.synchronize()
    dali.close()
    for b, got in enumerate(out):
        for k, (top, left, h, w) in enumerate(windows):
            image = Image.open(io.BytesIO(data[b][k])).convert("RGB").crop((left, top, left + w, top + h))
            full = torch.from_numpy(np.asarray(image.resize((32, 32), Image.BILINEAR)).copy())
            levels = (got[k].cpu().float() - full.float()).abs()
            assert levels.mean() <= 3.0, (b, k, float(levels.mean()))


def test_a_small_first_batch_leaves_the_jpeg_engines_their_share():
    """DALI's decoder (nvImageCodec) sizes the JPEG engines' share of a batch from the first batch it decodes, and
    the rest of every batch goes to nvJPEG's CUDA decoder, whose Huffman decoding runs on DALI's CPU threads: a
    pipeline whose first batch holds one JPEG (the first after ``decode="auto"`` moves a share to the GPU) spends
    no more of those threads' CPU on full batches than one whose first batch is full (on a GPU without engines,
    both decode on the CUDA decoder alike)."""
    _need_cuda()
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    import io
    from pathlib import Path

    from PIL import Image

    from lightning_gpu_boost.core.gpu_decode.dali_windows import DaliWindows
    from lightning_gpu_boost.core.gpu_decode.plan import geometry

    def jpeg(seed: int) -> bytes:  # noise: Huffman decoding costs what it costs on a large photograph
        buf = io.BytesIO()
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (375, 500, 3), dtype=np.uint8)).save(buf, "JPEG")
        return buf.getvalue()

    data = [jpeg(s) for s in range(64)]
    rows = np.zeros((64, max(map(len, data))), np.uint8)
    for k, d in enumerate(data):
        rows[k, : len(d)] = np.frombuffer(d, np.uint8)
    lengths = np.array([len(d) for d in data])
    g = geometry(375, 500, [("crop", 10, 20, 300, 400), ("resize", 224, 224)])
    geometries = np.array([[*g[0], *g[1], int(g[2])]] * 64)

    def decoder_threads_cpu() -> float:  # DALI's decoder threads ("[DALI][TPn]Mixe..."), CPU seconds so far
        total = 0.0
        for task in Path("/proc/self/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue
            if "Mixe" in stat[stat.index("(") + 1: stat.rindex(")")]:
                fields = stat[stat.rindex(")") + 2:].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    spent = {}
    for first in (64, 1):
        dali = DaliWindows("cuda", threads=4, pipes=1)
        dali.collect(dali.submit(rows[:first], lengths[:first], geometries[:first], capacity=64))
        before = decoder_threads_cpu()
        for _ in range(8):
            dali.collect(dali.submit(rows, lengths, geometries))
        spent[first] = decoder_threads_cpu() - before
        dali.close()
    assert spent[1] <= 2 * spent[64] + 0.1, spent
