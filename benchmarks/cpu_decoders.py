"""Whether another decoder makes the workers' CPU decode faster: the GPU decode's take-over decodes with Pillow (the
path of the split, and of a run whose placement keeps the CPU decode); simplejpeg (libjpeg-turbo without Pillow's
decoder object) and DCT-scaled decoding are the candidates. Side by side, in rounds.

    python benchmarks/cpu_decoders.py --out benchmarks/results    # a few minutes on 2 CPUs; torchvision, simplejpeg

The tree is the bench's kind (``make_jpeg_folder``: 400-560 x 320-440 pixels, quality 90). Each image gets one
``RandomResizedCrop(224)`` draw; each case runs the same images with the same draws, one process, one core. Cases:
the decode alone (Pillow's ``convert("RGB")``, simplejpeg's ``decode_jpeg`` with Pillow's settings) and the whole
path (the take-over's ``LazyImage`` and its decode, torchvision's ``resized_crop``, the uint8 tensor; with
simplejpeg, its pixels made a Pillow image for the same resize). Figures: img/s per case (the median round and
every round), whether the two paths' values are identical, and how many draws a DCT-scaled decode (Pillow's
``draft``, simplejpeg's ``min_height``) could shrink (a crop whose shorter side is at least twice the output).

Bars: simplejpeg's path against Pillow's, ``>= 1.05x``: a new dependency of the workers' path has to win by more
than a round's spread on a busy 2-CPU machine (about 10 %, median of 7 rounds); identical values.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from pathlib import Path

from lightning_gpu_boost.core.results import bar, write_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="/tmp/lgb-cpu-decoders", help="where the JPEG tree is made (once)")
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()

    import simplejpeg
    import torch
    from PIL import Image
    from torchvision.transforms import RandomResizedCrop
    from torchvision.transforms import functional as F

    from lightning_gpu_boost.core.gpu_decode import plan
    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.move_normalize import _to_uint8_chw

    root = Path(args.data) / f"jpeg-{args.images}"
    if not root.exists():
        make_jpeg_folder(root, n=args.images, num_classes=10, progress=False)
    paths = sorted(str(p) for p in root.rglob("*.jpg"))[: args.images]
    torch.manual_seed(0)
    crop = RandomResizedCrop(224)
    draws = [crop.get_params(Image.open(p), crop.scale, crop.ratio) for p in paths]

    def pillow_path(p: str, box: tuple) -> torch.Tensor:
        image = plan.LazyImage(p).decoded()
        return _to_uint8_chw(F.resized_crop(image, *box, [224, 224], F.InterpolationMode.BILINEAR, antialias=True))

    def simplejpeg_path(p: str, box: tuple) -> torch.Tensor:
        lazy = plan.LazyImage(p)  # the header, as the take-over reads it to draw the crop
        pixels = simplejpeg.decode_jpeg(lazy.data, colorspace="RGB", fastdct=False, fastupsample=False)
        image = Image.fromarray(pixels, "RGB")
        return _to_uint8_chw(F.resized_crop(image, *box, [224, 224], F.InterpolationMode.BILINEAR, antialias=True))

    datas = {p: Path(p).read_bytes() for p in paths}
    cases = {"pillow_decode": lambda p, box: Image.open(io.BytesIO(datas[p])).convert("RGB"),
             "simplejpeg_decode": lambda p, box: simplejpeg.decode_jpeg(datas[p], colorspace="RGB", fastdct=False,
                                                                        fastupsample=False),
             "pillow_path": pillow_path, "simplejpeg_path": simplejpeg_path}  # fmt: skip
    rounds: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):  # the cases in turn, round after round
        for name, run in cases.items():
            t0 = time.perf_counter()
            for p, box in zip(paths, draws, strict=True):
                run(p, box)
            rounds[name].append(len(paths) / (time.perf_counter() - t0))
    identical = all(torch.equal(pillow_path(p, b), simplejpeg_path(p, b)) for p, b in zip(paths, draws, strict=True))
    rates = {k: statistics.median(v) for k, v in rounds.items()}
    figures = {"config": vars(args), "simplejpeg": simplejpeg.__version__,
               "img_s": rates, "rounds_img_s": rounds, "identical_values": identical,
               "draws_a_dct_scale_could_shrink": sum(min(b[2], b[3]) >= 2 * 224 for b in draws),
               "draws": len(draws)}  # fmt: skip
    bars = {"simplejpeg_path_vs_pillow": bar(rates["simplejpeg_path"] / rates["pillow_path"], 1.05, "x"),
            "identical_values": bar(float(identical), 1.0, "bool")}  # fmt: skip
    for name, rate in rates.items():
        print(f"{name}: {rate:,.0f} img/s (rounds {[round(r) for r in rounds[name]]})")
    print(f"identical values: {identical}; wrote {write_result('cpu_decoders', figures, bars, args.out)}")


if __name__ == "__main__":
    main()
