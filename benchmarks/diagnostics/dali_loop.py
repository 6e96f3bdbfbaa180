"""Diagnosis: DALI loaders side by side in a plain PyTorch loop (no Lightning), against the same loop's ceiling.

    python benchmarks/dali_loop.py

ResNet-50, bf16 autocast, channels_last model, batch 256, one epoch of warm-up and two timed epochs per variant:

- ``ceiling``: one batch already on the GPU;
- ``loader``: :class:`DALILoader` as DALIDataModule builds it (``--options`` changes it, e.g. ``pipelines=1``;
  ``threaded=0`` runs it without its producer thread);
- ``reference``: NVIDIA's recipe as the anchor ran it: ``fn.readers.file`` → ``fn.decoders.image_random_crop``
  (mixed) → ``fn.resize`` → ``fn.crop_mirror_normalize`` (float16, CHW), consumed by ``DALIGenericIterator``
  (``hw_decoder_load`` given by ``--reference-hw``, DALI's default 0.65);
- ``graph``: our :func:`classification_graph` (float16, HWC, hw_decoder_load 0.99) behind ``fn.readers.file``
  (``--sources ext``: behind an external source of paths, as DALILoader feeds it), consumed by
  ``DALIGenericIterator``: our operators without our loader (one run per ``--threads`` value).

The gap between ``graph`` and ``loader`` is what our loader costs. ``--lookahead`` fetches batch N+1 before step N
runs, as Lightning's training loop does. ``--repeat`` rounds of every variant show the run-to-run spread.
"""

from __future__ import annotations

import functools
import time

import torch
from _common import demo_tree, parser_for

from lightning_gpu_boost.core.dali import classification_graph
from lightning_gpu_boost.core.results import write_result
from lightning_gpu_boost.core.steady import ResidentBatches
from lightning_gpu_boost.datamodules.dali import DALIDataModule
from lightning_gpu_boost.models import ImageClassifier


def plain_loop(batches, steps: int, warmup: int, lookahead: bool = False) -> float:
    """img/s of a hand-written bf16 training loop over ``batches`` (an iterable of GPU batches). ``lookahead``:
    fetch batch N+1 before running step N, as Lightning's training loop does."""
    torch.manual_seed(0)
    model = ImageClassifier("resnet50", num_classes=100, channels_last=True).cuda()
    opt = model.configure_optimizers()
    it, seen, t0 = iter(batches), 0, 0.0

    def fetch():
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = iter(batches)
            return next(it)

    pending = fetch() if lookahead else None
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            t0, seen = time.perf_counter(), 0
        if lookahead:
            (x, y), pending = pending, fetch()
        else:
            x, y = fetch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        seen += x.shape[0]
    torch.cuda.synchronize()
    return seen / (time.perf_counter() - t0)


class _Paths:
    """An ``external_source`` batch callable: file paths (UTF-8 bytes) and labels, shuffled, cycling forever."""

    def __init__(self, root, batch_size: int) -> None:
        import numpy as np

        from lightning_gpu_boost.core.images import scan_image_folder

        samples = scan_image_folder(root)[0]
        order = np.random.default_rng(0).permutation(len(samples))
        self.items = [(np.frombuffer(str(samples[i][0]).encode(), np.uint8), samples[i][1]) for i in order]
        self.batch_size, self.np = batch_size, np

    def __call__(self, info):
        start = (info.iteration * self.batch_size) % (len(self.items) - self.batch_size)
        items = self.items[start : start + self.batch_size]
        return [p for p, _ in items], self.np.array([label for _, label in items], dtype=self.np.int64)


class Generic:
    """``DALIGenericIterator`` over a pipeline whose images come from ``build(encoded)``. ``source``: ``file``
    (``fn.readers.file``, shuffled), ``ext`` (an ``external_source`` of paths read by ``fn.io.file.read`` without
    mmap, as DALILoader does), ``ext-mmap`` (the same with mmap)."""

    def __init__(
        self, root, build, batch_size: int, threads: int, channels_last: bool, source: str = "file"
    ) -> None:
        from nvidia.dali import Pipeline, fn, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        pipe = Pipeline(
            batch_size=batch_size, num_threads=threads, device_id=0, seed=0, prefetch_queue_depth=2
        )
        with pipe:
            if source == "file":
                encoded, labels = fn.readers.file(file_root=str(root), random_shuffle=True, name="Reader")
            else:
                paths, labels = fn.external_source(
                    source=_Paths(root, batch_size), num_outputs=2, batch=True, batch_info=True,
                    dtype=[types.UINT8, types.INT64],
                )  # fmt: skip
                encoded = fn.io.file.read(paths, dont_use_mmap=source == "ext")
            pipe.set_outputs(build(encoded), labels.gpu())
        pipe.build()
        self.channels_last = channels_last
        self.it = DALIGenericIterator(
            pipe, ["x", "y"], **({"reader_name": "Reader"} if source == "file" else {"size": -1}),
            last_batch_policy=LastBatchPolicy.DROP, auto_reset=True,
        )  # fmt: skip

    def __iter__(self):
        for out in self.it:
            x, y = out[0]["x"], out[0]["y"].reshape(-1).long()
            yield (x.permute(0, 3, 1, 2) if self.channels_last else x), y


def reference_graph(encoded, hw: float):
    from nvidia.dali import fn, types

    images = fn.decoders.image_random_crop(encoded, device="mixed", output_type=types.RGB, hw_decoder_load=hw)
    images = fn.resize(images, resize_x=224, resize_y=224)
    return fn.crop_mirror_normalize(
        images, dtype=types.FLOAT16, output_layout="CHW", mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
        std=[0.229 * 255, 0.224 * 255, 0.225 * 255], mirror=fn.random.coin_flip(probability=0.5),
    )  # fmt: skip


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--warmup", type=int, default=32)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[8],
        help="DALI CPU threads of the file-reader pipelines (one run each)",
    )
    parser.add_argument("--no-reference", action="store_true", help="skip NVIDIA's recipe")
    parser.add_argument(
        "--lookahead", action="store_true", help="fetch batch N+1 before step N (as Lightning)"
    )
    parser.add_argument(
        "--sources", nargs="+", default=["file"], help="sources of the graph runs: file ext ext-mmap"
    )
    parser.add_argument("--reference-hw", type=float, default=0.65)
    parser.add_argument(
        "--options", nargs="*", default=[""], help="DALILoader variants: k=v,k=v (one per run)"
    )
    parser.add_argument("--repeat", type=int, default=2, help="rounds of all variants (run-to-run spread)")
    args = parser.parse_args()
    root = demo_tree(args)
    x = torch.randn(args.batch_size, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    batch = (
        x.contiguous(memory_format=torch.channels_last),
        torch.randint(0, 100, (args.batch_size,), device="cuda"),
    )
    per_epoch = args.images // args.batch_size

    def run(name: str, make) -> None:
        data = make()
        value = plain_loop(data, args.steps, args.warmup, args.lookahead)
        if hasattr(data, "close"):
            data.close()
        rounds.setdefault(name, []).append(value)
        print(f"{name}: {value:,.0f} img/s", flush=True)

    def loader(options: str):
        kwargs = {"dtype": "bfloat16", "channels_last": True}
        for item in filter(None, options.split(",")):
            key, value = item.split("=", 1)
            kwargs[key] = int(value) if value.isdigit() else value
        threaded = kwargs.pop("threaded", 1)  # threaded=0: no producer thread, copies on the training stream
        dm = DALIDataModule(str(root), batch_size=args.batch_size, **kwargs)
        dm.setup("fit")
        loader = dm.train_dataloader()
        loader._threaded = bool(threaded)
        return loader

    rounds: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        run("ceiling", lambda: ResidentBatches(batch, per_epoch))
        for options in args.options:
            run(f"loader[{options}]", functools.partial(loader, options))
        reference = functools.partial(reference_graph, hw=args.reference_hw)
        graph = functools.partial(classification_graph, train=True, gpu=True, dtype="float16", channels_last=True,
                                  hw_decoder_load=0.99)  # fmt: skip
        for threads in args.threads:
            if not args.no_reference:
                run(
                    f"reference[{threads}]",
                    functools.partial(Generic, root, reference, args.batch_size, threads, False),
                )
            for source in args.sources:
                name = f"graph[{threads}]" if source == "file" else f"graph[{threads},{source}]"
                run(name, functools.partial(Generic, root, graph, args.batch_size, threads, True, source))
    ceiling = sum(rounds["ceiling"]) / len(rounds["ceiling"])
    of_ceiling = {name: [v / ceiling for v in values] for name, values in rounds.items()}
    for name, values in of_ceiling.items():
        print(f"{name}: " + ", ".join(f"{100 * v:.1f} %" for v in values))
    print(
        f"wrote {write_result('dali_loop', {'config': vars(args), 'img_s': rounds, 'of_ceiling': of_ceiling}, {}, args.out)}"
    )


if __name__ == "__main__":
    main()
