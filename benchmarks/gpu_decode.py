"""GPU decode, placed by measurement (issue 63), side by side in one run on the GPU machine.

    python benchmarks/gpu_decode.py --parts decoders,resnet50 --out /tmp/r1
    python benchmarks/gpu_decode.py --parts resnet50_4cpus,resnet18 --out /tmp/r2
    python benchmarks/gpu_decode.py --merge /tmp/r1/part.json /tmp/r2/part.json   # the result file, with bars

The bench's 64,000-JPEG tree (100 classes, 400-560 x 320-440 px) read by the user's loader as Lightning's ImageNet
example writes it: torchvision ``ImageFolder`` with ``RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
Normalize``, ``DataLoader(batch_size=256, shuffle=True)``; bf16, channels_last, batch 256. Cases per model: the
resident ceiling (the same batches in GPU memory), the one line ``GPUBoost()`` with ``decode="cpu"``, ``"gpu"`` and
``"auto"`` (its default), and where asked ``plain`` (no ``GPUBoost``: the example's loader with its 4 workers) and
``dali`` (``DALIDataModule`` on the same folder: the pipeline rewritten for DALI; left out where DALI is not installed).
``resnet50_4cpus``/``resnet50_8cpus``: the same ResNet-50 cases with the process held to 5 or 9 CPUs (the
training process and 4 or 8 for the workers). ``decoders``: each decoder alone (nvJPEG through the package's
``BatchDecoder``, with crop, resize, flip and normalize; DALI's pipelines each way, and their values against the
per-image path's; the CPU path per core, times the usable CPUs). ``handover_resnet18``/
``handover_resnet50``: the ``gpu`` case with DALI's images taken each way (``--variants``,
``gpu_decode_variants.py``), the training thread's time in DALI's calls per batch.

Steady state (``core/steady.py``, ``docs/method.md``): ThroughputMeter times ``--steps`` steps after the warm-up and
the loader's queue; the ``auto`` cases open their window once the placement is decided (``--auto-warmup``: at the
latest).
CPU cores used: the process's and its workers' CPU time over the fit's wall time; per 1,000 img/s. Each fit also
records its threads' CPU in the timed window and the GPU decode's counts (``gpu_decode_probes.py``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch
from _common import beside_training, demo_tree, parser_for, record_batches, resident_training
from gpu_decode_probes import (
    GpuTimeline,
    KernelProfile,
    MainThreadProfile,
    OpenAfterPlacement,
    ThreadsAndDecoders,
    dali_parity,
    lower_median,
    process_on,
)
from gpu_decode_variants import VARIANTS, NoPinLoader, handover, keep_off_cpus

from lightning_gpu_boost.core.results import bar, gpu_tag, write_result

CASES = ("cpu", "gpu", "auto")  # and "plain" where asked (--cases): the loader as Lightning's example writes it


def _cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def fit_case(root: Path, arch: str, decode: str | None, args: argparse.Namespace) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from lightning_gpu_boost.baselines import plain_image_folder
    from lightning_gpu_boost.callbacks import GPUBoost
    from lightning_gpu_boost.core.steady import ResidentBatches
    from lightning_gpu_boost.doctor import measure_fit
    from lightning_gpu_boost.models import ImageClassifier

    torch.manual_seed(0)
    model = ImageClassifier(arch, 100, channels_last=True)
    bs = args.batch_size
    if decode in (None, "plain", "dali"):  # without GPUBoost: the resident ceiling (the same batches in GPU memory),
        # the user's script as it is (Lightning's ImageNet example's loader, its 4 workers), or DALIDataModule (the
        # pipeline rewritten: DALI decodes the random-resized crop, resizes, flips and normalizes)
        if decode is None:
            batch = (torch.randint(0, 256, (bs, 3, 224, 224), dtype=torch.uint8, device="cuda"),
                     torch.randint(0, 100, (bs,), device="cuda"))  # fmt: skip
            data: Any = ResidentBatches(batch, -(-args.images // bs))
        elif decode == "dali":
            from lightning_gpu_boost.datamodules.dali import DALIDataModule

            data = DALIDataModule(str(root), batch_size=bs, image_size=224, dtype="bfloat16", channels_last=True)
        else:
            data = DataLoader(plain_image_folder(root, 224), batch_size=bs, shuffle=True, num_workers=4)
        timeline = [GpuTimeline()] if getattr(args, "timeline", False) else []
        if getattr(args, "kernel_profile", None):
            timeline.append(KernelProfile(*args.kernel_profile))
        result = measure_fit(model, data, args.steps, args.warmup, tuple(timeline), precision="bf16-mixed")
        for callback in timeline:
            result.update(callback.figures())
        return result if decode is None else {**result, "num_workers": 4 if decode == "plain" else None,
                                              "decode": decode}  # fmt: skip
    fixed = getattr(args, "loader_workers", None)  # a handover variant's fixed worker count (AutoNumWorkers off)
    reserved = getattr(args, "reserve_cpus", 0)  # a handover variant's: the workers kept off the first N CPUs
    nice = getattr(args, "nice_workers", 0)  # a handover variant's: the workers' niceness raised by N
    by_name = getattr(args, "by_name", False)  # a handover variant's: the batches' shared memory crosses by name
    init = functools.partial(keep_off_cpus, reserved, nice, by_name=by_name) if reserved or nice or by_name else None
    kind = NoPinLoader if getattr(args, "no_pin", False) else DataLoader  # a handover variant's: no pin-memory thread
    loader = kind(plain_image_folder(root, 224), batch_size=bs, shuffle=True,  # the user's loader, as written
                        **({"num_workers": fixed} if fixed is not None else {}),
                        **({"worker_init_fn": init} if init else {}))  # fmt: skip
    boost = GPUBoost(decode=decode, workers_budget_s=args.workers_budget, auto_workers=fixed is None,
                     watchdog=getattr(args, "watchdog", True))  # a handover variant turns the watchdog off
    cpu0, wall0 = _cpu_seconds(), time.perf_counter()
    warmup = args.auto_warmup if decode == "auto" else args.warmup
    extra: list[Any] = [ThreadsAndDecoders(boost)]  # each thread's CPU in the window, the decoders' counts
    if decode == "auto":  # the window opens after the placement is decided (at the latest after --auto-warmup)
        extra.append(OpenAfterPlacement(boost))
    if decode == "gpu" and args.profile_steps:
        extra.append(MainThreadProfile(*args.profile_steps))
    if getattr(args, "kernel_profile", None):  # what runs on the GPU beside the step
        extra.append(KernelProfile(*args.kernel_profile))
    extra += [GpuTimeline()] if getattr(args, "timeline", False) else []
    result = measure_fit(model, loader, args.steps, warmup, (boost, *extra), precision="bf16-mixed")
    for callback in extra:
        result.update(callback.figures())
    wall = time.perf_counter() - wall0
    result["cpu_cores_used"] = (_cpu_seconds() - cpu0) / wall
    result["cpu_cores_per_1000_img_s"] = result["cpu_cores_used"] / (result["samples_per_s"] / 1000)
    result["num_workers"] = boost.parts["auto_workers"].chosen.get("train") if fixed is None else fixed
    result["decode"] = boost.parts["prefetch"].decode_placement
    return result


def model_part(root: Path, arch: str, args: argparse.Namespace, cpus: int | None = None) -> dict[str, Any]:
    everyone = sorted(os.sched_getaffinity(0))
    if cpus is not None:
        process_on(everyone[: cpus + 1])  # the training process and `cpus` for the workers
    try:
        runs: dict[str, list[dict[str, Any]]] = {}
        order = (["ceiling"] if cpus is None and args.ceiling else []) + args.cases.split(",")
        skipped = {"dali": "DALI is not installed"} if "dali" in order and not find_spec("nvidia.dali") else {}
        order = [case for case in order if case not in skipped]
        for r in range(args.rounds):  # the cases in turn, round after round: fits differ more than their halves
            for case in order:
                result = fit_case(root, arch, None if case == "ceiling" else case, args)
                runs.setdefault(case, []).append(result)
                print(f"{arch} ({cpus or 'all'} CPUs), round {r + 1}: {case} {result['samples_per_s']:,.0f} img/s "
                      f"({result.get('decode')})", flush=True)  # fmt: skip
        cases = {case: lower_median(found) for case, found in runs.items()}
        return {"arch": arch, "worker_cpus": cpus or len(everyone), "cases": cases, "skipped": skipped}
    finally:
        process_on(everyone)


def decoders(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Each decoder alone on the tree's first files: nvJPEG with the GPU steps, and the CPU path per core."""
    from PIL import Image

    from lightning_gpu_boost.baselines import plain_image_folder
    from lightning_gpu_boost.core.cpus import usable_cpus
    from lightning_gpu_boost.core.gpu_decode import BatchDecoder, Share, take_over

    dataset = plain_image_folder(root, 224)
    paths = [p for p, _ in dataset.samples[:: max(1, len(dataset.samples) // 2048)][:2048]]
    t0 = time.perf_counter()
    for p in paths[:400]:  # the CPU path: decode, random-resized crop, flip, ToTensor, Normalize
        dataset.transform(Image.open(p).convert("RGB"))
    cpu_per_core = 400 / (time.perf_counter() - t0)
    take_over(dataset, Share(1.0))
    records = [dataset[i * max(1, len(dataset) // 2048)][0] for i in range(2048)]
    from torch.utils.data import default_collate
    decoder = BatchDecoder((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), device="cuda", dtype="bfloat16")
    bs = args.batch_size
    batches = [default_collate(records[k * bs: (k + 1) * bs]) for k in range(len(records) // bs)]  # as workers do

    def timed(fn) -> tuple[float, float, float]:
        """img/s of ``fn(batch)`` over the batches, this thread's CPU s per batch, and the process's CPU cores (every
        thread: DALI's, the driver's) per 1,000 img/s (4 untimed batches first: pipelines built)."""
        for k in range(4):
            fn(batches[k])
        torch.cuda.synchronize()
        t0, c0, p0, n = time.perf_counter(), time.thread_time(), time.process_time(), len(batches)
        for batch in batches:
            fn(batch)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        return n * bs / wall, (time.thread_time() - c0) / n, (time.process_time() - p0) / (n * bs / 1000)

    from torchvision.io import ImageReadMode, decode_jpeg

    def nvjpeg_alone(batch):
        decode_jpeg(batch.jpegs(), device="cuda", mode=ImageReadMode.RGB)

    alone, alone_cpu, alone_cores = timed(nvjpeg_alone)
    full, full_cpu, full_cores = timed(decoder.images)
    dali: dict[str, Any] = {}
    through = BatchDecoder((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), device="cuda", dtype="bfloat16")
    if through.asynchronous:  # DALI: begun two batches ahead, ended in order, as the prefetcher does
        from collections import deque

        held: deque = deque()

        def begun(batch) -> None:
            held.append(through.begin([batch]))
            if len(held) > 2:
                through.end(held.popleft())

        from lightning_gpu_boost.core.gpu_decode.dali_windows import DaliWindows

        # side by side; hw_decoder_load 0: nvJPEG's CUDA decoder alone (its Huffman decoding on DALI's threads)
        for load, threads, pipes in ((1.0, 8, 2), (1.0, 8, 3), (0.0, 8, 2), (1.0, 4, 2)):
            through._dali, through.engine_load = DaliWindows("cuda", threads=threads, hw_decoder_load=load,
                                                             pipes=pipes), load  # fmt: skip
            rate, thread_cpu, cores = timed(begun)
            while held:
                through.end(held.popleft())
            dali[f"dali_path_hw_load_{load}_threads_{threads}_pipes_{pipes}"] = {
                "img_s": rate, "thread_cpu_s_per_batch": thread_cpu, "process_cores_per_1000_img_s": cores}
            through._dali.close()
            print(f"decoders: {dali}", flush=True)
        # DALI's images (it resizes and flips them) against the package's per-image path on the same records
        dali["dali_vs_package_levels"] = dali_parity(batches[:2])
        print(f"decoders: {dali}", flush=True)
    else:
        dali = {"dali_path": through.dali_unavailable}
    return {**dali, "cpu_path_img_s_per_core": cpu_per_core, "usable_cpus": usable_cpus(),
            "cpu_path_img_s_host": cpu_per_core * usable_cpus(), "nvjpeg_alone_img_s": alone,
            "nvjpeg_alone_thread_cpu_s_per_batch": alone_cpu, "nvjpeg_alone_process_cores_per_1000_img_s": alone_cores,
            "gpu_path_img_s": full, "gpu_path_thread_cpu_s_per_batch": full_cpu,
            "gpu_path_process_cores_per_1000_img_s": full_cores, "gpu_decoder": decoder.decoder_name}  # fmt: skip


def engines(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """nvImageCodec's decoders (the GPU's JPEG engines, its CUDA decoder, the hybrid one) alone, with the crop
    decoded as a region where the engine allows, and each GPU path beside a training loop on resident batches:
    what a decoder costs the model is the model's rate beside it over its rate alone (one run, side by side)."""
    from lightning_gpu_boost.core.gpu_decode import BatchDecoder
    from lightning_gpu_boost.core.gpu_decode.plan import geometry

    try:
        from nvidia import nvimgcodec as nic
    except ImportError as e:
        return {"skipped": f"nvImageCodec is not installed ({e})"}
    bs = args.batch_size
    batches = record_batches(root, bs)
    datas = [[bytes(t.numpy()) for t in b.jpegs()] for b in batches]
    streams = [[nic.CodeStream(d) for d in ds] for ds in datas]
    geos = [[geometry(cs.height, cs.width, o) for cs, o in zip(ss, b.ops, strict=True)]
            for ss, b in zip(streams, batches, strict=True)]  # fmt: skip
    rois = [[cs.get_sub_code_stream(region=nic.Region(g[0][0], g[1][0], g[0][0] + g[0][1], g[1][0] + g[1][1]))
             for cs, g in zip(ss, gs, strict=True)] for ss, gs in zip(streams, geos, strict=True)]  # fmt: skip
    params = nic.DecodeParams(color_spec=nic.ColorSpec.SRGB, sample_format=nic.SampleFormat.P_RGB)
    out: dict[str, Any] = {"nvimgcodec": getattr(nic, "__version__", None), "batch_size": bs}

    def decoder_for(kind: str) -> Any:
        return nic.Decoder(backends=[nic.Backend(getattr(nic.BackendKind, kind))])

    def timed(fn, rounds: int = 2) -> dict[str, float]:
        fn(0)
        torch.cuda.synchronize()
        t0, c0, n = time.perf_counter(), time.thread_time(), 0
        for _ in range(rounds):
            for k in range(len(batches)):
                fn(k)
                n += 1
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        return {"img_s": n * bs / wall, "thread_cpu_s_per_batch": (time.thread_time() - c0) / n}

    side = torch.cuda.Stream()
    for kind in ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU"):
        try:
            dec = decoder_for(kind)
            got = dec.decode(streams[0][:4], params=params)
            if any(g is None for g in got):
                out[kind] = {"error": "decoded None"}
                continue
            full = timed(lambda k, d=dec: d.decode(streams[k], params=params, cuda_stream=side.cuda_stream))
            roi = timed(lambda k, d=dec: d.decode(rois[k], params=params, cuda_stream=side.cuda_stream))
            out[kind] = {"full_decode": full, "region_decode": roi}
        except Exception as e:
            out[kind] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print(f"engines: {kind}: {out[kind]}", flush=True)
    # the package's GPU path (decode, crop, resize, flip, normalize) with each decoder
    decoders = {name: BatchDecoder((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), device="cuda", dtype="bfloat16",
                                   engines=name == "hw_engines") for name in ("torchvision_nvjpeg", "hw_engines")}  # fmt: skip
    paths = {name: (lambda k, d=d: d.images(batches[k])) for name, d in decoders.items()}
    for name, fn in paths.items():
        with torch.cuda.stream(side):
            out[f"gpu_path_{name}"] = {**timed(fn), "decoder": decoders[name].decoder_name}
    for arch in ("resnet50", "resnet18"):
        train = resident_training(arch, bs)
        train(15)
        steps = 60 if arch == "resnet50" else 150
        res: dict[str, Any] = {"model_alone_img_s": train(steps)}
        runs = [(f"{name}{'_high_priority' if p else ''}", fn, p) for name, fn in paths.items() for p in (0, -1)]
        for name, fn, priority in runs:  # the prefetcher decodes on a stream of the highest priority (-1)
            res[name] = beside_training(train, fn, len(batches), bs, steps, res["model_alone_img_s"],
                                        priority=priority)  # fmt: skip
        res["model_alone_again_img_s"] = train(steps)
        out[f"beside_{arch}"] = res
        print(f"engines: beside {arch}: {res}", flush=True)
    return out


def engine_threads(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The JPEG engines' rate by the size of nvImageCodec's CPU thread pool (it parses the JPEGs; 0: one thread per
    core, its default), alone and with every CPU busy (a worker per CPU spinning, as the CPU decode's workers are)."""
    import multiprocessing as mp

    from nvidia import nvimgcodec as nic

    from lightning_gpu_boost.core.gpu_decode.engines import code_stream

    bs = args.batch_size
    jpegs = [b.jpegs() for b in record_batches(root, bs, 1024)]
    params = nic.DecodeParams(color_spec=nic.ColorSpec.SRGB, sample_format=nic.SampleFormat.P_RGB)
    out: dict[str, Any] = {}

    def rate(threads: int) -> dict[str, float]:
        dec = nic.Decoder(max_num_cpu_threads=threads, backends=[nic.Backend(nic.BackendKind.HW_GPU_ONLY)])
        run = lambda: [dec.decode([code_stream(nic, t) for t in b], params=params) for b in jpegs]  # noqa: E731
        run()
        torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), _cpu_seconds()
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        return {"img_s": 3 * len(jpegs) * bs / wall, "process_cpu_cores": (_cpu_seconds() - c0) / wall}

    for busy in (False, True):
        hogs = []
        if busy:
            hogs = [mp.get_context("fork").Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)]
            for h in hogs:
                h.start()
        try:
            for threads in (1, 2, 4, 0):
                out[f"{'busy' if busy else 'idle'}_threads_{threads}"] = rate(threads)
                print(f"engine_threads: {'busy' if busy else 'idle'} {threads}: {out}", flush=True)
        finally:
            for h in hogs:
                h.kill()
    return out


def profile(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Where the GPU path's CPU time goes: each stage of ``BatchDecoder.images`` timed on its own thread's CPU
    clock (the engines), cProfile's top functions, and the path in a thread beside a training loop in the main
    thread by the interpreter's switch interval (the two threads share the GIL) and inline between steps."""
    import cProfile
    import io
    import pstats

    from nvidia import nvimgcodec as nic

    from lightning_gpu_boost.core.gpu_decode import BatchDecoder
    from lightning_gpu_boost.core.gpu_decode.engines import code_stream
    from lightning_gpu_boost.core.gpu_decode.plan import geometry

    bs = args.batch_size
    batches = [b.pin_memory() for b in record_batches(root, bs)]
    dec = BatchDecoder((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), device="cuda", dtype="bfloat16")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for b in batches[:2]:
            dec.images(b)
    torch.cuda.synchronize()
    engine = dec._engines._decoder
    params = nic.DecodeParams(color_spec=nic.ColorSpec.SRGB, sample_format=nic.SampleFormat.P_RGB)
    stages: dict[str, float] = {}

    def clock(name: str, fn: Any) -> Any:
        c0 = time.thread_time()
        out = fn()
        stages[name] = stages.get(name, 0.0) + (time.thread_time() - c0) / len(batches)
        return out

    kept = None
    with torch.cuda.stream(side):
        for b in batches:
            jpegs = clock("jpeg_views", b.jpegs)
            streams = clock("code_streams", lambda j=jpegs: [code_stream(nic, t) for t in j])
            imgs = clock("engines_decode", lambda s=streams: engine.decode(s, params=params,
                                                                           cuda_stream=side.cuda_stream))
            torch.cuda.synchronize()
            try:
                kept = clock("engines_decode_reusing_images", lambda s=streams, k=kept: engine.decode(
                    s, images=k if k is not None else None, params=params, cuda_stream=side.cuda_stream))
            except Exception as e:
                stages["reuse_error"] = f"{type(e).__name__}: {e}"[:200]  # type: ignore[assignment]
            ts = clock("as_tensor", lambda i=imgs: [torch.as_tensor(im, device="cuda") for im in i])
            clock("from_dlpack", lambda i=imgs: [torch.from_dlpack(im) for im in i])
            clock("geometry", lambda t=ts, b=b: [geometry(int(x.shape[-2]), int(x.shape[-1]), o)
                                                  for x, o in zip(t, b.ops, strict=True)])
            clock("resample", lambda t=ts, b=b: dec._resample(t, b.ops, (224, 224)))
            clock("images_whole", lambda b=b: dec.images(b))
            torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for b in batches:
            dec.images(b)
        prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    out: dict[str, Any] = {"thread_cpu_s_per_batch": stages, "cprofile_top": text.getvalue()[-6000:]}
    print(f"profile: {stages}", flush=True)
    print(text.getvalue()[-6000:], flush=True)

    train = resident_training("resnet18", bs)
    train(15)
    alone = train(150)
    res: dict[str, Any] = {"model_alone_img_s": alone}
    default_interval = sys.getswitchinterval()
    for interval in (default_interval, 0.001, 0.0002):
        sys.setswitchinterval(interval)
        try:
            res[f"thread_switch_{interval * 1000:g}ms"] = beside_training(
                train, lambda k: dec.images(batches[k]), len(batches), bs, 150, alone)
        finally:
            sys.setswitchinterval(default_interval)
        print(f"profile: beside resnet18: {res}", flush=True)
    s = torch.cuda.Stream(priority=-1)

    def inline(k: int) -> None:  # a batch decoded on the side stream before each step, as the prefetcher inline
        with torch.cuda.stream(s):
            images = dec.images(batches[k % len(batches)])
        torch.cuda.current_stream().wait_stream(s)
        images.record_stream(torch.cuda.current_stream())

    res["inline"] = {"model_img_s": train(150, inline)}
    res["inline"]["model_vs_alone"] = res["inline"]["model_img_s"] / alone
    out["beside_resnet18"] = res
    print(f"profile: beside resnet18: {res}", flush=True)
    return out


def _spin() -> None:
    while True:
        pass


def merge(parts: list[str], out: str, probes: list[str] | None = None, suffix: str = "") -> Path:
    """One result file from part files (each one call of the machine): a later file's part replaces an earlier
    one's; every ratio is taken inside one run (a part's ceiling is its own run's ResNet-50 or ResNet-18 ceiling),
    and each part names its run. A part whose run measured no ceiling (``resnet50_4cpus`` alone) takes the ceiling
    of the latest earlier run of the same commit on the same machine, and names that run (``ceiling_run``).
    ``probes``: the probes' JSON files (``gpu_decode_probe.py``, ``gpu_decode_dali_probe.py``), kept whole."""
    figures: dict[str, Any] = {"parts": {}, "runs": []}
    ceilings: dict[str, tuple[float, int, str]] = {}  # arch -> (img/s, run, commit)
    for path in parts:
        found = json.loads(Path(path).read_text())
        run = {**found["run"], "config": found["config"], "file": Path(path).name}
        figures["runs"].append(run)
        commit = found["run"]["environment"].get("git_commit")
        for name, part in found["parts"].items():
            arch = part.get("arch")
            base = part.get("cases", {}).get("ceiling") or (
                found["parts"].get(arch, {}).get("cases", {}).get("ceiling") if arch else None)
            extra: dict[str, Any] = {}
            ceiling = base["samples_per_s"] if base else None
            if base:
                ceilings[arch] = (ceiling, len(figures["runs"]) - 1, commit)
            elif arch in ceilings and ceilings[arch][2] == commit:
                ceiling, extra["ceiling_run"] = ceilings[arch][0], ceilings[arch][1]
            figures["parts"][name] = {**part, "run": len(figures["runs"]) - 1, "ceiling_samples_per_s": ceiling,
                                      **extra}  # fmt: skip
    if probes:
        figures["probes"] = {Path(p).name: json.loads(Path(p).read_text()) for p in probes}
    bars: dict[str, Any] = {}
    p = figures["parts"]
    for name, part in p.items():
        if "cases" not in part:
            continue
        for r in part["cases"].values():
            if part["ceiling_samples_per_s"]:
                r["of_ceiling"] = r["samples_per_s"] / part["ceiling_samples_per_s"]
        if isinstance(part["cases"].get("auto", {}).get("decode"), dict):  # the window opened after the decision
            auto = part["cases"]["auto"]
            auto["placement_decided"] = not str(auto["decode"].get("why", "")).startswith("measuring")
        if "auto" in part["cases"] and "cpu" in part["cases"]:
            auto, cpu = part["cases"]["auto"], part["cases"]["cpu"]
            part["auto_vs_cpu"] = auto["samples_per_s"] / cpu["samples_per_s"]
            bars[f"{name}_auto_vs_cpu_decode"] = bar(part["auto_vs_cpu"], 0.98, "x")
            if "rounds_samples_per_s" in auto and "rounds_samples_per_s" in cpu:  # each round's own ratio too
                part["auto_vs_cpu_by_round"] = [a / c for a, c in zip(auto["rounds_samples_per_s"],
                                                                      cpu["rounds_samples_per_s"], strict=True)]  # fmt: skip
                bars[f"{name}_auto_vs_cpu_decode_worst_round"] = bar(min(part["auto_vs_cpu_by_round"]), 0.98, "x")
        if "auto" in part["cases"] and part["ceiling_samples_per_s"]:
            target = {"resnet50": 0.97, "resnet18": 0.80, "resnet50_4cpus": 0.90}.get(name)  # 8 CPUs: no bar
            if target is not None:
                bars[f"{name}_one_line_of_ceiling"] = bar(part["cases"]["auto"]["of_ceiling"], target, "ratio")
    halves = [c.get("halves_diff", 0.0) for part in p.values() for c in part.get("cases", {}).values()]
    bars["steady_state_halves_max_diff"] = bar(max(halves), 0.05, "ratio", higher_is_better=False)
    # the machine that measured: the last run's environment (each run keeps its own in figures.runs)
    env = {**figures["runs"][-1]["environment"], "merged_from": [r["file"] for r in figures["runs"]]}
    tag = gpu_tag(env) + (f"-{suffix}" if suffix else "")
    return write_result("gpu_decode", figures, bars, out, env=env, tag=tag)


def main() -> int:
    parser = parser_for(__doc__)  # --data, --images, --batch-size, --out
    parser.set_defaults(images=64000)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="the cases in turn, this many times (lower median)")
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--auto-warmup", type=int, default=1600, help="the most untimed steps of the auto cases: "
                        "their window opens once the placement is decided (its search and the decoder's choice: up "
                        "to eight windows of 24 batches, each after the batches held ahead; 1,092 steps on an "
                        "H200), at the latest after these")
    parser.add_argument("--profile-steps", type=int, nargs=2, metavar=("FIRST", "LAST"), help="cProfile the "
                        "training thread of the gpu cases from step FIRST to LAST")
    parser.add_argument("--search-window", type=int, help="the batches `auto` times each GPU share over (the "
                        "package's default where not given): a longer window reads a share's rate with less spread")
    parser.add_argument("--kernel-profile", type=int, nargs=2, metavar=("FIRST", "LAST"), help="torch's profiler "
                        "over every CUDA kernel from step FIRST to LAST of each case: device time per "
                        "step by kernel and by who launched it (the step, DALI, copies)")
    parser.add_argument("--workers-budget", type=float, default=10.0, help="AutoNumWorkers' probe budget (5 s "
                        "could not rank the counts of the GPU decode's cheap workers: it kept 0)")
    parser.add_argument("--parts", default="decoders,resnet50,resnet50_4cpus,resnet18")
    parser.add_argument("--cases", default=",".join(CASES), help="decode settings to run, of cpu,gpu,auto, and "
                        "plain (no GPUBoost: Lightning's ImageNet example's loader, 4 workers) and dali "
                        "(DALIDataModule: the pipeline rewritten for DALI; where DALI is installed)")  # fmt: skip
    parser.add_argument("--no-ceiling", dest="ceiling", action="store_false", help="leave the ceiling out")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="the handover part's variants, of "
                        + ",".join(VARIANTS))  # fmt: skip
    parser.add_argument("--timeline", action="store_true", help="each case's last 96 steps on the training stream: "
                        "the GPU's step time, the gaps between steps, whether the training thread was ahead")
    parser.add_argument("--dali-pipes", type=int, help="the model parts' DALI pipelines (default: the package's)")
    parser.add_argument("--dali-hw-load", type=float, help="the model parts' share of each batch for the JPEG "
                        "engines, in [0, 1] (DALI's hw_decoder_load; the package's default where not given)")
    parser.add_argument("--no-decoder-choice", action="store_true", help="auto keeps the engines (no DecoderChoice)")
    parser.add_argument("--merge", nargs="+", help="part files to merge into the result file")
    parser.add_argument("--probes", nargs="+", help="with --merge: the probes' JSON files, kept in the result")
    parser.add_argument("--suffix", default="", help="with --merge: after the machine in the file's name (a second "
                        "result of one day)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be an int >= 1, got {args.rounds}")
    if args.dali_pipes is not None and args.dali_pipes < 1:
        parser.error(f"--dali-pipes must be an int >= 1, got {args.dali_pipes}")
    if args.dali_hw_load is not None and not 0 <= args.dali_hw_load <= 1:
        parser.error(f"--dali-hw-load must be in [0, 1], got {args.dali_hw_load}")
    if args.search_window is not None and args.search_window < 2:
        parser.error(f"--search-window must be an int >= 2, got {args.search_window}")
    if args.merge:
        print(f"wrote {merge(args.merge, args.out, args.probes, args.suffix)}")
        return 0
    t0 = time.perf_counter()
    root = demo_tree(args)
    from lightning_gpu_boost.core.results import environment

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {k: getattr(args, k) for k in ("images", "batch_size", "steps", "warmup", "auto_warmup", "variants",
                                            "profile_steps", "rounds", "dali_pipes", "timeline", "kernel_profile",
                                            "search_window", "dali_hw_load", "no_decoder_choice")}  # fmt: skip
    dali = {k: v for k, v in (("pipes", args.dali_pipes), ("hw_decoder_load", args.dali_hw_load)) if v is not None}
    if dali:  # the model parts' pipelines (the handover part's variants set their own)
        from lightning_gpu_boost.core.gpu_decode import decode as decode_module
        from lightning_gpu_boost.core.gpu_decode.dali_windows import DaliWindows

        decode_module.DaliWindows = functools.partial(DaliWindows, **dali)
    if args.search_window is not None:  # the auto cases' placement search, each share timed over more batches
        from lightning_gpu_boost.callbacks import _gpu_decode
        from lightning_gpu_boost.core.gpu_decode.placement import SplitSearch

        _gpu_decode.SplitSearch = functools.partial(SplitSearch, window=args.search_window)
    if args.no_decoder_choice:  # auto as before DecoderChoice: the JPEG engines kept
        from lightning_gpu_boost.callbacks._gpu_decode import GPUDecodeStage
        GPUDecodeStage.engines_choosable = lambda self, share: False  # type: ignore[method-assign]
    parts: dict[str, Any] = {}
    for part in args.parts.split(","):
        if part == "decoders":
            parts[part] = decoders(root, args)
            print(f"decoders: {parts[part]}", flush=True)
        elif part == "engine_threads":
            parts[part] = engine_threads(root, args)
        elif part == "profile":
            parts[part] = profile(root, args)
        elif part == "engines":
            parts[part] = engines(root, args)
        elif part in ("handover_resnet18", "handover_resnet50"):
            parts[part] = handover(root, part.split("_")[1], args, fit_case)
        elif part in ("resnet50_4cpus", "resnet50_8cpus"):
            parts[part] = model_part(root, "resnet50", args, cpus={"resnet50_4cpus": 4, "resnet50_8cpus": 8}[part])
        elif part in ("resnet50", "resnet18"):
            parts[part] = model_part(root, part, args)
        else:
            raise SystemExit(f"--parts: unknown part {part!r}")
        # after each part: a call cut short by its time limit keeps the parts it finished
        run = {"parts": list(parts), "seconds": time.perf_counter() - t0, "environment": environment(),
               "command": " ".join(sys.argv)}  # fmt: skip
        (out / "part.json").write_text(json.dumps({"parts": parts, "config": config, "run": run}, indent=2))
        print(f"wrote {out / 'part.json'} after {run['seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
