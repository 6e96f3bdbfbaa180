"""Probe (issue 63): a GPU path with few GIL round trips per batch, beside a training loop in the main thread.

    python benchmarks/gpu_decode_probe.py --images 8000 --out /tmp/probe

Variants per batch of 256 JPEGs: ``current`` (``BatchDecoder.images``); ``external`` (each JPEG's crop window
decoded by the engines straight into one batch buffer, HWC, wrapped by ``__cuda_array_interface__`` objects: no
torch call per image); ``memcpy`` (the engines decode into reused images, the windows are copied with
``cudaMemcpy2DAsync`` through ctypes, holding the GIL). Each alone (thread CPU per batch) and in a thread beside
ResNet-18 training in the main thread.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from _common import beside_training, demo_tree, parser_for, record_batches, resident_training, write_probe


class _Cai:
    """A device buffer described by ``__cuda_array_interface__`` (pure Python: no torch call)."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, ptr: int, shape: tuple, strides: tuple) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "strides": strides, "data": (ptr, False),
                                         "typestr": "|u1", "version": 3}  # fmt: skip


def _cudart() -> Any:
    cands = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcudart.so*"))
    cands += glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libcudart*.so*"))
    for c in cands + ["libcudart.so"]:
        try:
            return ctypes.PyDLL(c)
        except OSError:
            continue
    return None


def setup(root: Path, bs: int) -> tuple[list, list, Any, dict[str, Any], dict[str, Any]]:
    """The batches, their geometries (what the workers send), the windows' resample and normalize, each variant's
    function ``fn(k) -> images of batch k`` (on the current stream), and the result so far."""
    from nvidia import nvimgcodec as nic

    from lightning_gpu_boost.core.gpu_decode import BatchDecoder
    from lightning_gpu_boost.core.gpu_decode.decode import _axis_weights
    from lightning_gpu_boost.core.gpu_decode.plan import geometry

    batches = [b.pin_memory() for b in record_batches(root, bs)]
    # what the workers would send: each sample's geometry (they know the size from the header)
    geos = []
    for b in batches:
        sizes = [nic.CodeStream(t.numpy()) for t in b.jpegs()]
        g = [geometry(cs.height, cs.width, o) for cs, o in zip(sizes, b.ops, strict=True)]
        geos.append(torch.tensor([[*r, *c, int(f)] for r, c, f in g], dtype=torch.int64))
    dec = BatchDecoder((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), device="cuda", dtype="bfloat16")
    dev = torch.device("cuda")
    local = threading.local()

    def engine_here() -> Any:  # one decoder per thread
        if getattr(local, "engine", None) is None:
            local.engine = nic.Decoder(backends=[nic.Backend(nic.BackendKind.HW_GPU_ONLY)])
        return local.engine

    p_hwc = nic.DecodeParams(color_spec=nic.ColorSpec.SRGB, sample_format=nic.SampleFormat.I_RGB)
    scale = (1.0 / (255.0 * torch.tensor((0.229, 0.224, 0.225)))).view(1, 3, 1, 1).to(dev)
    shift = (-torch.tensor((0.485, 0.456, 0.406)) / torch.tensor((0.229, 0.224, 0.225))).view(1, 3, 1, 1).to(dev)
    cudart = _cudart()
    result: dict[str, Any] = {"cudart": str(cudart)}
    kept: dict[int, Any] = {}

    def finish(windows: torch.Tensor, g: torch.Tensor, tall: int, wide: int) -> torch.Tensor:
        gd = g.to(dev, non_blocking=True)
        rows, cols, flips = gd[:, 0:5].float(), gd[:, 5:10].float(), gd[:, 10].bool()
        wy = _axis_weights(rows[:, 1], rows[:, 2], rows[:, 3], 224, tall).half()
        wx = _axis_weights(cols[:, 1], cols[:, 2], cols[:, 3], 224, wide, flips).half()
        chw = windows.permute(0, 3, 1, 2).half()  # (n, 3, tall, wide)
        img = torch.matmul(torch.matmul(wy[:, None], chw), wx[:, None].transpose(-1, -2)).float()
        img.round_().clamp_(0, 255)
        o = torch.empty(img.shape, dtype=torch.bfloat16, device=dev, memory_format=torch.channels_last)
        return torch.addcmul(shift, img, scale, out=o)

    def external(k: int) -> torch.Tensor:
        b, g = batches[k], geos[k]
        gl = g.tolist()
        tall = max(r[1] for r in gl)
        wide = max(r[6] for r in gl)
        windows = torch.empty((len(gl), tall, wide, 3), dtype=torch.uint8, device=dev)
        base = windows.data_ptr()
        subs, outs = [], []
        for i, (r, jpeg) in enumerate(zip(gl, b.jpegs(), strict=True)):
            cs = nic.CodeStream(jpeg.numpy())
            subs.append(cs.get_sub_code_stream(region=nic.Region(r[0], r[5], r[0] + r[1], r[5] + r[6])))
            outs.append(nic.as_image(_Cai(base + i * tall * wide * 3, (r[1], r[6], 3), (wide * 3, 3, 1))))
        s = torch.cuda.current_stream()
        engine_here().decode(subs, images=outs, params=p_hwc, cuda_stream=s.cuda_stream)
        return finish(windows, g, tall, wide)

    def memcpy(k: int) -> torch.Tensor:
        b, g = batches[k], geos[k]
        gl = g.tolist()
        tall = max(r[1] for r in gl)
        wide = max(r[6] for r in gl)
        s = torch.cuda.current_stream()
        streams = [nic.CodeStream(jpeg.numpy()) for jpeg in b.jpegs()]
        imgs = engine_here().decode(streams, images=kept.get(k % 2), params=p_hwc, cuda_stream=s.cuda_stream)
        kept[k % 2] = imgs
        windows = torch.empty((len(gl), tall, wide, 3), dtype=torch.uint8, device=dev)
        base, sp = windows.data_ptr(), s.cuda_stream
        for i, (r, im) in enumerate(zip(gl, imgs, strict=True)):
            cai = im.__cuda_array_interface__
            pitch = cai["strides"][0] if cai.get("strides") else cai["shape"][1] * 3
            src = cai["data"][0] + r[0] * pitch + r[5] * 3
            cudart.cudaMemcpy2DAsync(ctypes.c_void_p(base + i * tall * wide * 3), ctypes.c_size_t(wide * 3),
                                     ctypes.c_void_p(src), ctypes.c_size_t(pitch), ctypes.c_size_t(r[6] * 3),
                                     ctypes.c_size_t(r[1]), ctypes.c_int(3), ctypes.c_void_p(sp))  # fmt: skip
        return finish(windows, g, tall, wide)

    return batches, geos, finish, {"current": lambda k: dec.images(batches[k]), "external": external, "memcpy": memcpy}, result


def decode_process(root: str, bs: int, ring_q: Any, done_q: Any, stop: Any) -> None:
    """The memcpy variant in a process of its own: batches into a ring of 3 shared CUDA buffers, in a loop."""
    batches, _, _, fns, _ = setup(Path(root), bs)
    fn = fns["memcpy"]
    ring = torch.empty((3, bs, 3, 224, 224), dtype=torch.bfloat16, device="cuda")
    ring_q.put(ring)
    s = torch.cuda.Stream()
    k = 0
    with torch.cuda.stream(s):
        while not stop.is_set():
            ring[k % 3].copy_(fn(k % len(batches)))
            s.synchronize()
            done_q.put(k)
            k += 1
    done_q.put(-1)
    time.sleep(2.0)  # the parent drops its handles first


def main() -> int:
    parser = parser_for(__doc__)
    parser.set_defaults(images=8000)
    args = parser.parse_args()
    root = demo_tree(args)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    bs = args.batch_size
    batches, _, _, variants, result = setup(root, bs)
    side = torch.cuda.Stream()
    ref = None
    for name, fn in list(variants.items()):
        try:
            with torch.cuda.stream(side):
                got = fn(0)
                torch.cuda.synchronize()
                if ref is None:
                    ref = got.float()
                diff = (got.float() - ref).abs()
                result[f"{name}_vs_current"] = {"mean": diff.mean().item(), "max": diff.max().item()}
                fn(1)
                torch.cuda.synchronize()
                t0, c0, n = time.perf_counter(), time.thread_time(), 0
                for _ in range(3):
                    for k in range(len(batches)):
                        fn(k)
                        n += 1
                torch.cuda.synchronize()
                result[f"{name}_alone"] = {"img_s": n * bs / (time.perf_counter() - t0),
                                           "thread_cpu_ms_per_batch": 1000 * (time.thread_time() - c0) / n}  # fmt: skip
        except Exception as e:
            result[f"{name}_error"] = f"{type(e).__name__}: {e}"[:400]
            variants.pop(name)
        print(json.dumps(result), flush=True)

    train = resident_training("resnet18", bs)
    train(15)
    alone = train(200)
    result["model_alone_img_s"] = alone
    for name, fn in variants.items():
        if name != "memcpy":  # measured in the previous run: every thread variant starves beside the training loop
            continue
        result[f"{name}_beside_resnet18_threads_1"] = beside_training(train, fn, len(batches), bs, 200, alone)
        print(json.dumps(result), flush=True)
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    ring_q, done_q, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=decode_process, args=(str(root), bs, ring_q, done_q, stop), daemon=True)
    proc.start()
    ring = [ring_q.get(timeout=120)]
    first = done_q.get(timeout=120)
    latest = [first]

    fed_input = torch.empty((bs, 3, 224, 224), device="cuda").to(memory_format=torch.channels_last)
    got = [0]

    def latest_batch(k: int) -> torch.Tensor:  # the step's input: the decode process's latest batch
        while not done_q.empty():
            latest[0] = done_q.get_nowait()
            got[0] += 1
        return fed_input.copy_(ring[0][latest[0] % 3])

    def train_fed(steps: int) -> tuple[float, int]:
        got[0] = 0
        return train(steps, latest_batch), got[0]

    train_fed(20)
    t0 = time.perf_counter()
    rate, got = train_fed(300)
    wall = time.perf_counter() - t0
    result["memcpy_in_a_process_beside_resnet18"] = {"model_img_s": rate, "model_vs_alone": rate / alone,
                                                     "decode_img_s": got * bs / wall}  # fmt: skip
    stop.set()
    ring.clear()
    proc.join(timeout=30)
    print(json.dumps(result), flush=True)
    result["model_alone_again_img_s"] = train(200)
    write_probe(result, out_dir / "probe.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
