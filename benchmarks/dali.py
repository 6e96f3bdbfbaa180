"""DALIDataModule (from the JPEG folder and from an LMDB pack) against the ceiling, side by side in one run.

    python benchmarks/dali.py

ResNet-50, bf16-mixed, batch 256, channels_last, in a Lightning Trainer. Ceiling: the same Trainer and step with
one batch already on the GPU, yielded again and again, in epochs of the same number of batches as DALI's (so
both pay Lightning's epoch boundaries); ``ceiling_one_epoch`` (never crossing an epoch boundary) is reported
too. DALI: ``DALIDataModule`` with its defaults except the dtype (bfloat16) and layout (channels_last) of the
ceiling's batch (``decoder_device="auto"``: CPU decoding from 8 DALI threads per process, so on a 16-core
machine); ``--variants`` adds runs with other options, e.g. ``decoder_device=mixed`` (GPU decoding). Steady
state: one epoch of warm-up (DALI's memory pools and the hardware decoder settle during the first epoch), then
two timed epochs (8,000 images, 32 batches per epoch). CPU use is this process's CPU time per second (DALI's
threads and the training loop); the ceiling's shows what the training loop alone uses.
Bars (issue 7): DALI from the folder >= 95 % of the ceiling, from LMDB >= 90 %.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from _common import demo_tree, fit_resnet50, parser_for

from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter
from lightning_gpu_boost.core.cpus import usable_cpus
from lightning_gpu_boost.core.lmdb import pack_image_folder
from lightning_gpu_boost.core.results import bar, write_result
from lightning_gpu_boost.core.steady import ResidentBatches, worst_halves_diff
from lightning_gpu_boost.datamodules.dali import DALIDataModule


def fit(data, args, meter_warmup: int) -> dict:
    meter = ThroughputMeter(warmup=meter_warmup)
    fit_resnet50(data, args.warmup + args.steps, [meter])
    return meter.summary()


def _options(text: str) -> dict:
    """``k=v,k=v`` as DALIDataModule options; ``decoder.k=v`` and ``pipeline.k=v`` go to ``decoder_options`` and
    ``pipeline_options``."""
    options: dict = {}
    for key, value in (item.split("=", 1) for item in text.split(",") if item):
        group, _, name = key.rpartition(".")
        target = options.setdefault(f"{group}_options", {}) if group else options
        target[name] = _value(value)
    return options


def _value(text: str) -> object:
    """``true``/``false``, a number, or the string itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--warmup", type=int, default=32, help="untimed steps (default: one epoch)")
    parser.add_argument("--steps", type=int, default=64, help="timed steps (default: two epochs)")
    parser.add_argument("--variants", nargs="+", default=[],
                        help="extra runs: HW_DECODER_LOAD:PREFETCH_QUEUE_DEPTH (e.g. 0.65:4), "
                             "default, or DALIDataModule options (dtype=float16,channels_last=false), from the "
                             "folder; with an lmdb- prefix, from the pack")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="diagnosis: no endless-epoch ceiling and no LMDB run (no bars)")
    parser.add_argument("--options", default="",
                        help="DALIDataModule options of the bar runs, e.g. decoder_device=mixed,pipelines=3")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/dali.py needs a CUDA GPU.")
    root = demo_tree(args)
    pack, t0 = Path(f"{args.data}/jpeg-{args.images}-100.lmdb"), time.perf_counter()
    if not pack.exists():
        pack_image_folder(root, pack, progress=False)
    pack_s = time.perf_counter() - t0

    x = torch.randn(args.batch_size, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    batch = (
        x.contiguous(memory_format=torch.channels_last),
        torch.randint(0, 100, (args.batch_size,), device="cuda"),
    )
    per_epoch = -(-args.images // args.batch_size)
    ceiling = fit(ResidentBatches(batch, per_epoch), args, args.warmup)
    one_epoch = None if args.quick else fit(ResidentBatches(batch, 10**6), args, args.warmup)
    print(f"ceiling (batch on the GPU, {per_epoch} batches per epoch): {ceiling['samples_per_s']:,.0f} img/s; "
          f"in one endless epoch: {one_epoch['samples_per_s'] if one_epoch else float('nan'):,.0f} img/s")  # fmt: skip

    def dali(source: str, **options) -> dict:
        dm = DALIDataModule(
            source, batch_size=args.batch_size, **{"dtype": "bfloat16", "channels_last": True, **options}
        )
        result = fit(dm, args, args.warmup)
        result |= {"of_ceiling": result["samples_per_s"] / ceiling["samples_per_s"], "options": options,
                   "decoder": dm.decoder_in_use,
                   "hw_decoder_load": dm.hw_decoder_load, "prefetch_queue_depth": dm.prefetch_queue_depth,
                   "dali_cpu_cores": result["process_cpu_cores"] - ceiling["process_cpu_cores"]}  # fmt: skip
        print(f"DALI from {source}: {result['samples_per_s']:,.0f} img/s = {100 * result['of_ceiling']:.1f} % of the "
              f"ceiling, {result['process_cpu_cores']:.1f} CPU cores busy, data wait {result['data_wait_frac']:.2f} "
              f"(decoder {dm.decoder_in_use}, hw_decoder_load={dm.hw_decoder_load}, "
              f"prefetch_queue_depth={dm.prefetch_queue_depth})")  # fmt: skip
        return result

    folder = dali(str(root), **_options(args.options))  # the bar's run (the defaults unless --options)
    lmdb = None if args.quick else dali(str(pack), **_options(args.options))
    variants = []
    for variant in args.variants:
        source = str(pack) if variant.startswith("lmdb-") else str(root)
        name = variant.removeprefix("lmdb-")
        if name == "default":  # the defaults again: run-to-run spread
            variants.append(dali(source))
            continue
        if "=" in name:  # DALIDataModule options, e.g. dtype=float16,channels_last=false
            variants.append(dali(source, **_options(name)))
            continue
        load, depth = name.split(":")
        variants.append(dali(str(root), hw_decoder_load=float(load), prefetch_queue_depth=int(depth)))
    figures = {
        "config": vars(args), "usable_cpus": usable_cpus(), "pack_s": pack_s, "ceiling": ceiling,
        "ceiling_one_epoch": one_epoch, "batches_per_epoch": per_epoch,
        "dali_folder": folder, "dali_lmdb": lmdb, "dali_folder_variants": variants,
    }  # fmt: skip
    bars = {} if args.quick else {
        "dali_folder_of_ceiling": bar(folder["of_ceiling"], 0.95, "ratio"),
        "dali_lmdb_of_ceiling": bar(lmdb["of_ceiling"], 0.90, "ratio"),
    }
    # every timed case: ThroughputMeter's window (queue skipped, halves compared; core/steady.py)
    timed = {k: figures[k] for k in ("ceiling", "ceiling_one_epoch", "dali_folder", "dali_lmdb", "dali_folder_variants")}
    bars["steady_state_halves_max_diff"] = bar(worst_halves_diff(timed), 0.05, "ratio", higher_is_better=False)
    print(f"wrote {write_result('dali', figures, bars, args.out)}")


if __name__ == "__main__":
    main()
