"""What every benchmark script shares: its common arguments and the demo JPEG tree."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from lightning_gpu_boost.core.images import make_jpeg_folder


def parser_for(doc: str | None) -> argparse.ArgumentParser:
    """A parser with ``--data``, ``--images``, ``--batch-size`` and ``--out``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=".demo-data", help="folder of the generated demo JPEGs")
    parser.add_argument("--images", type=int, default=8000, help="demo JPEGs (100 classes)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--out", default="benchmarks/results", help="where the JSON and Markdown results go")
    return parser


def demo_tree(args: argparse.Namespace) -> Path:
    """The demo JPEG tree for ``args.images`` images (generated once, then reused)."""
    return make_jpeg_folder(f"{args.data}/jpeg-{args.images}-100", n=args.images, num_classes=100)


def fit_resnet50(data, max_steps: int, callbacks: list) -> None:
    """Train ResNet-50 (100 classes, bf16-mixed, channels_last) on ``data`` (a DataModule or a loader) for
    ``max_steps`` in a quiet Lightning Trainer on one device (on a host of several GPUs ``devices="auto"`` would run
    DDP): the training run every DALI benchmark measures."""
    import lightning.pytorch as pl
    import torch

    from lightning_gpu_boost.models import ImageClassifier

    torch.manual_seed(0)
    trainer = pl.Trainer(
        devices=1, max_steps=max_steps, precision="bf16-mixed", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, callbacks=callbacks,
    )  # fmt: skip
    model = ImageClassifier("resnet50", num_classes=100, channels_last=True)
    if isinstance(data, pl.LightningDataModule):
        trainer.fit(model, datamodule=data)
    else:
        trainer.fit(model, data)


def carried_over(path: str | Path, names: list[str], section: str | None = None) -> dict[str, dict[str, Any]]:
    """For ``--keep``: the entries ``names`` of an earlier result's figures (or of ``figures[section]``) that it
    holds, each with the commit and the GPU it was measured on (its own ``git_commit`` and ``gpu``, else the
    file's)."""
    earlier = json.loads(Path(path).read_text())
    found = earlier["figures"] if section is None else earlier["figures"][section]
    commit, gpu = earlier["environment"].get("git_commit"), earlier["environment"].get("gpu")
    return {n: {**found[n], "git_commit": found[n].get("git_commit", commit), "gpu": found[n].get("gpu", gpu)}
            for n in names if n in found}  # fmt: skip


def dd_read(path: str | os.PathLike) -> float:
    """Bytes/s of ``dd`` reading the whole file in 8 MiB blocks (through the page cache, with its read-around)."""
    import subprocess
    import time

    start = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=8M"], check=True, capture_output=True)
    return os.path.getsize(path) / (time.perf_counter() - start)


def parallel_read(path: str | os.PathLike, threads: int = 16, direct: bool = True, chunk: int = 8 << 20) -> float:
    """Bytes/s of ``threads`` threads reading the whole file in ``chunk``-byte pieces, each thread taking the next
    piece (``os.preadv``, which lets go of the GIL): with ``direct`` (``O_DIRECT``: no page cache, the device's own
    rate; buffered where the filesystem refuses it), the most the disk reads with many requests in flight."""
    import mmap
    import threading
    import time

    size = os.path.getsize(path)
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct and hasattr(os, "O_DIRECT") else 0))
    except OSError:
        fd = os.open(path, os.O_RDONLY)
    lock, nxt = threading.Lock(), [0]

    def work() -> None:
        buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
        while True:
            with lock:
                off = nxt[0]
                nxt[0] += chunk
            if off >= size:
                break
            os.preadv(fd, [buf], off)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    start = time.perf_counter()
    try:
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        os.close(fd)
    return size / (time.perf_counter() - start)


def drop_cache(paths: list[str]) -> str:
    """Drop the page cache: all of it where permitted (root: ``drop_caches``), else each file's pages
    (``posix_fadvise(DONTNEED)``, which evicts clean unmapped pages); says which."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "posix_fadvise"


def resident_training(arch: str, batch_size: int, device: str = "cuda") -> Any:
    """A torchvision ``arch`` (100 classes, channels_last, SGD, bf16 autocast) training on one batch held on
    ``device``; returns ``train(steps, before=None) -> img/s``: ``before(k)``, where given, runs before step ``k``
    and returns the step's input (``None``: the resident batch). The GPU decode's probes time decoders beside it."""
    import time

    import torch
    import torchvision

    model = getattr(torchvision.models, arch)(num_classes=100).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch_size, 3, 224, 224, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 100, (batch_size,), device=device)
    torch.backends.cudnn.benchmark = True
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def train(steps: int, before: Any = None) -> float:
        sync()
        t0 = time.perf_counter()
        for k in range(steps):
            given = before(k) if before is not None else None
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x if given is None else given), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync()
        return steps * batch_size / (time.perf_counter() - t0)

    return train


def beside_training(train: Any, decode: Any, batches: int, batch_size: int, steps: int, alone: float,
                    threads: int = 1, priority: int = -1) -> dict[str, float]:  # fmt: skip
    """``decode(k)`` run in a loop (batch ``k`` of ``batches``, each waited for) in ``threads`` threads, each on a CUDA
    stream of ``priority``, while ``train(steps)`` (:func:`resident_training`) runs in this thread: the model's
    img/s, its ratio to ``alone`` and the decode's img/s meanwhile."""
    import threading
    import time

    import torch

    stop, done = threading.Event(), [0]

    def loop(first: int) -> None:
        s = torch.cuda.Stream(priority=priority)
        with torch.cuda.stream(s):
            k = first
            while not stop.is_set():
                decode(k % batches)
                s.synchronize()
                done[0] += 1
                k += threads

    workers = [threading.Thread(target=loop, args=(j,), daemon=True) for j in range(threads)]
    for w in workers:
        w.start()
    time.sleep(1.0)
    d0, t0 = done[0], time.perf_counter()
    rate = train(steps)
    decoded = (done[0] - d0) * batch_size / (time.perf_counter() - t0)
    stop.set()
    for w in workers:
        w.join()
    return {"model_img_s": rate, "model_vs_alone": rate / alone, "decode_img_s": decoded}


def record_batches(root: Path, batch_size: int, n: int = 2048) -> list[Any]:
    """Batches of ``n`` GPU-decode records (the JPEGs and drawn parameters the workers send), spread over the tree
    of ``root`` read as the user's ``ImageFolder`` with Lightning's ImageNet example's transforms, taken over."""
    from torch.utils.data import default_collate

    from lightning_gpu_boost.baselines import plain_image_folder
    from lightning_gpu_boost.core.gpu_decode import Share, take_over

    dataset = plain_image_folder(root, 224)
    take_over(dataset, Share(1.0))
    step = max(1, len(dataset) // n)
    records = [dataset[i * step][0] for i in range(n)]
    return [default_collate(records[k * batch_size: (k + 1) * batch_size]) for k in range(n // batch_size)]


def write_probe(result: dict[str, Any], path: Path) -> None:
    """A probe's figures with the host's CPU model, as JSON (printed too)."""
    with open("/proc/cpuinfo") as f:
        result["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2), flush=True)
