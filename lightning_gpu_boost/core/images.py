"""Fast uint8 image decoding and cropping with Pillow, image-folder scanning and the synthetic JPEG maker.

The decode path reads only what the output needs: the crop box is chosen in the source's coordinates first,
then JPEG decoding is asked for the smallest DCT scale (1/2, 1/4, 1/8) that still covers the box at the output
resolution (``Image.draft``), and crop + resize run in one Pillow call. The result stays uint8, CHW; it is
normalized later on the GPU (or in the step on CPU), which moves 4x fewer bytes than float32.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import stat as stat_module
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image

__all__ = ['Box', 'IMAGENET_MEAN', 'IMAGENET_STD', 'IMG_EXTENSIONS', 'center_crop_box', 'decode_center_crop', 'decode_random_resized_crop', 'describe_paths', 'make_jpeg_folder', 'random_resized_crop_box', 'scan_image_folder', 'shrink_image', 'walk_files']

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Box = tuple[float, float, float, float]


def random_resized_crop_box(
    width: int,
    height: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    rng: random.Random | None = None,
) -> Box:
    """The (left, top, right, bottom) box of torchvision's ``RandomResizedCrop`` for an image of this size."""
    rnd = rng or random
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rnd.uniform(scale[0], scale[1])
        aspect = math.exp(rnd.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            left = rnd.randint(0, width - w)
            top = rnd.randint(0, height - h)
            return (left, top, left + w, top + h)
    # fallback: central crop with the ratio clamped into range
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return (left, top, left + w, top + h)


def center_crop_box(width: int, height: int, size: int, resize: int) -> Box:
    """Box of "resize the shorter side to ``resize``, then center-crop ``size``" in source coordinates."""
    side = min(width, height) * size / resize
    left, top = (width - side) / 2, (height - side) / 2
    return (left, top, left + side, top + side)


def _draft_for_box(img: Image.Image, box: Box, size: int) -> Box:
    """Ask JPEG decoding for the coarsest DCT scale that keeps ``box`` at least ``size`` pixels wide and tall.

    Must run before the image is loaded; returns ``box`` in the coordinates of the reduced image.
    """
    width, height = img.size
    box_w, box_h = box[2] - box[0], box[3] - box[1]
    if img.format == "JPEG" and box_w > 0 and box_h > 0:
        want = (math.ceil(width * size / box_w), math.ceil(height * size / box_h))
        if want[0] < width and want[1] < height:
            img.draft("RGB", want)
    sx, sy = img.size[0] / width, img.size[1] / height
    return (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)


def _to_rgb(img: Image.Image) -> Image.Image:
    """3-channel 8-bit RGB from any mode: grayscale, palette, RGBA/LA (alpha dropped), CMYK, and 16- or 32-bit
    grayscale (scaled to 8 bits, not clipped)."""
    if img.mode == "RGB":
        return img
    if img.mode.startswith("I") or img.mode == "F":
        values = np.asarray(img).astype(np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or values.max(initial=0) > 255 else 255.0
        img = Image.fromarray(np.clip(values * (255.0 / top) + 0.5, 0, 255).astype(np.uint8), "L")
    return img.convert("RGB")


def _crop_resize(img: Image.Image, box: Box, size: int) -> Image.Image:
    return _to_rgb(img).resize((size, size), Image.BILINEAR, box=box)


_TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height


def _orientation(img: Image.Image) -> int:
    """The EXIF orientation (1 = as stored) of an opened image; 1 where there is none or it cannot be read."""
    if "exif" not in img.info and img.format != "TIFF":
        return 1
    try:
        value = int(img.getexif().get(0x0112, 1) or 1)
    except Exception:  # a damaged EXIF block: show the image as stored
        return 1
    return value if 1 <= value <= 8 else 1


def _decode_box(img: Image.Image, box_of: Callable[[int, int], Box], size: int) -> Image.Image:
    """Crop ``box_of(width, height)`` (in the upright image's coordinates, after its EXIF orientation) and resize
    it to ``size`` x ``size``, decoding JPEG at the coarsest DCT scale that covers the box."""
    orientation = _orientation(img)
    if orientation == 1:
        box = box_of(*img.size)
        return _crop_resize(img, _draft_for_box(img, box, size), size)
    from PIL import ImageOps

    width, height = img.size[::-1] if orientation in _TRANSPOSED else img.size
    box = box_of(width, height)
    box_w, box_h = box[2] - box[0], box[3] - box[1]
    _draft_for_box(img, (0, 0, box_h, box_w) if orientation in _TRANSPOSED else (0, 0, box_w, box_h), size)
    upright = ImageOps.exif_transpose(img)  # decodes at the draft scale, then turns the pixels upright
    sx, sy = upright.size[0] / width, upright.size[1] / height
    return _crop_resize(upright, (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy), size)


def shrink_image(data: bytes | bytearray | memoryview, max_side: int, quality: int = 90) -> bytes | None:
    """Pack-time resize, as FFCV does: an image whose shorter side exceeds ``max_side`` is decoded (JPEG at the
    coarsest DCT scale that keeps the shorter side >= ``max_side``), turned upright (EXIF orientation), made RGB,
    resized so its shorter side is ``max_side`` and re-encoded as JPEG at ``quality``; ``None`` where the image is
    small enough already (its bytes are kept unchanged). Raises ``OSError``/``ValueError`` where it cannot decode."""
    img = Image.open(io.BytesIO(bytes(data)))
    width, height = img.size
    short = min(width, height)
    if short <= max_side:
        return None
    scale = max_side / short
    if img.format == "JPEG":
        img.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
    if _orientation(img) != 1:
        from PIL import ImageOps

        img = ImageOps.exif_transpose(img)  # decodes at the draft scale, then turns the pixels upright
    img = _to_rgb(img)
    w, h = img.size
    scale = max_side / min(w, h)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    img = img.resize(size, Image.LANCZOS, reducing_gap=2.0)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=quality)
    return out.getvalue()


def _to_chw_uint8(img: Image.Image) -> torch.Tensor:
    # one copy into a writable array; the CHW view is made contiguous by the collate's stack
    return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1)


def decode_random_resized_crop(
    path: str | os.PathLike,
    size: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip_p: float = 0.5,
    rng: random.Random | None = None,
) -> torch.Tensor:
    """Decode ``path`` into a random-resized, randomly flipped ``uint8`` CHW crop of ``size`` x ``size``."""
    rnd = rng or random
    with Image.open(path) as img:
        out = _decode_box(img, lambda w, h: random_resized_crop_box(w, h, scale, ratio, rnd), size)
    if rnd.random() < flip_p:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return _to_chw_uint8(out)


def decode_center_crop(path: str | os.PathLike, size: int, resize: int | None = None) -> torch.Tensor:
    """Decode ``path``, resize its shorter side to ``resize`` (default ``size / 0.875``) and center-crop ``size``."""
    resize = resize or int(round(size / 0.875))
    with Image.open(path) as img:
        return _to_chw_uint8(_decode_box(img, lambda w, h: center_crop_box(w, h, size, resize), size))


def walk_files(top: str | os.PathLike, visited: set[tuple[int, int]], skipped: list[str]) -> Iterator[str]:
    """Every file under ``top`` in sorted order, following links to directories but visiting each real directory
    once: a link into a directory already visited (an ancestor, itself, or one in ``visited`` from the caller) is
    not followed and is added to ``skipped``. ``visited`` holds ``(st_dev, st_ino)`` pairs and is updated."""
    stat = os.stat(top)
    key = (stat.st_dev, stat.st_ino)
    if key in visited:
        skipped.append(str(top))
        return
    visited.add(key)
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)
    except OSError:
        skipped.append(str(top))
        return
    for entry in entries:
        try:
            is_dir = entry.is_dir()  # follows links
        except OSError:
            is_dir = False
        if is_dir:
            yield from walk_files(entry.path, visited, skipped)
        else:
            yield entry.path


def describe_paths(paths: list[str], most: int = 5) -> str:
    """The first ``most`` paths, escaped (``repr``: a name that is not UTF-8 shows its bytes), and how many more."""
    shown = ", ".join(repr(p) for p in paths[:most])
    return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")


def scan_image_folder(
    root: str | os.PathLike, stats: dict[str, os.stat_result] | None = None, special: list[str] | None = None
) -> tuple[list[tuple[str, int]], list[str], int]:
    """List ``root/<class>/<image>`` files in a deterministic order (``stats``: filled with each listed file's
    ``os.stat`` result, which the scan takes anyway, for a caller that needs sizes or times).

    Only regular files are listed: a FIFO, a device (a link to ``/dev/zero``) or a socket named like an image is
    never opened (a FIFO would block the reader for ever); such files are appended to ``special`` where given (the
    caller lists them, as ``pack`` lists broken files), else named in one warning.

    Links are followed, but every real directory is visited once (by device and inode): a link back into an
    ancestor, into itself, or into another class folder is skipped with one warning naming the links, so no file
    is listed twice and none gets another class's label; a file reached twice (two links to it) is listed once.

    Returns:
        ``(samples, classes, ignored)``: ``(path, class_index)`` pairs, the sorted class names, and the count of
        files ignored because their extension is not an image extension.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        ValueError: ``root`` has no class folders, or a class folder holds no image.
    """
    import warnings

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"Image folder {str(root)!r} does not exist or is not a directory.")
    classes = sorted(
        entry.name for entry in os.scandir(root) if entry.is_dir() and not entry.name.startswith(".")
    )
    if not classes:
        raise ValueError(
            f"Image folder {str(root)!r} has no class folders; expected the layout root/<class_name>/<image>.jpg."
        )
    samples: list[tuple[str, int]] = []
    ignored = 0
    skipped: list[str] = []
    not_regular: list[str] = special if special is not None else []
    # the root and every class folder count as visited from the start: a link into them is never followed
    reserved = {(s.st_dev, s.st_ino) for s in (os.stat(p) for p in [root, *(root / c for c in classes)])}
    seen_files: set[tuple[int, int]] = set()
    for index, name in enumerate(classes):
        found = 0
        folder = root / name
        visited = reserved - {(os.stat(folder).st_dev, os.stat(folder).st_ino)}
        for path in walk_files(folder, visited, skipped):
            filename = os.path.basename(path)
            if filename.lower().endswith(IMG_EXTENSIONS):
                try:
                    stat = os.stat(path)
                    key = (stat.st_dev, stat.st_ino)
                except OSError:  # a dangling link: listed, so that the pack names it
                    key = None
                if key is not None and not stat_module.S_ISREG(stat.st_mode):
                    not_regular.append(path)
                    continue
                if key is not None and key in seen_files:
                    skipped.append(path)
                    continue
                if key is not None:
                    seen_files.add(key)
                    if stats is not None:
                        stats[path] = stat
                samples.append((path, index))
                found += 1
            elif not filename.startswith("."):
                ignored += 1
        reserved |= visited
        if not found:
            raise ValueError(
                f"Class folder {str(root / name)!r} holds no image (extensions {', '.join(IMG_EXTENSIONS)}). "
                "Remove the folder or add images, so that class indices stay what you expect."
            )
    if not_regular and special is None:
        warnings.warn(
            f"{str(root)!r}: {len(not_regular)} files named like images are not regular files (a FIFO, a device, a "
            f"socket) and are left out, never opened: {describe_paths(not_regular)}.",
            stacklevel=2,
        )
    if skipped:
        shown = describe_paths(skipped)
        warnings.warn(
            f"{str(root)!r}: {len(skipped)} links lead to a directory or file already listed (a loop, an ancestor, "
            f"another class folder, or a second link to one file) and were not followed: {shown}.",
            stacklevel=2,
        )
    return samples, classes, ignored


# --------------------------------------------------------------------------------------------------------------
# Synthetic ImageNet-like JPEGs
# --------------------------------------------------------------------------------------------------------------


def _synthetic_jpeg(path: str, seed: int, size_range: tuple[int, int, int, int], quality: int) -> int:
    """Write one smooth random colour field plus noise as a JPEG; returns its size in bytes."""
    rng = np.random.default_rng(seed)
    width = int(rng.integers(size_range[0], size_range[1] + 1))
    height = int(rng.integers(size_range[2], size_range[3] + 1))
    coarse = rng.integers(0, 256, size=(int(rng.integers(3, 9)), int(rng.integers(3, 9)), 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), dtype=np.int16)
    noise = rng.normal(0.0, 14.0, size=(height, width, 3))
    pixels = np.clip(field + noise, 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG", quality=quality)
    return os.path.getsize(path)


_CHUNK = 32  # images per task of make_jpeg_folder's pool


def make_jpeg_folder(
    root: str | os.PathLike,
    n: int = 8000,
    num_classes: int = 100,
    size_range: Sequence[int] = (400, 560, 320, 440),
    quality: int = 90,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = True,
) -> Path:
    """Write a deterministic ImageNet-like synthetic JPEG tree ``root/class_XXX/img_XXXXXX.jpg``.

    Images are smooth random colour fields plus noise, ``size_range = (min_w, max_w, min_h, max_h)`` pixels,
    about 70 KiB each at the defaults. A finished tree is recorded in ``root/.complete.json``; calling again
    with the same arguments returns at once.

    Args:
        root: folder to create (parents included).
        n: number of images, spread evenly over the classes.
        num_classes: number of class folders.
        size_range: ``(min_width, max_width, min_height, max_height)``.
        quality: JPEG quality.
        seed: makes the tree reproducible.
        workers: processes used to encode (default: all usable CPUs), at most one per 32 images; a tree of 32
            images or fewer is encoded in this process.
        progress: show a progress bar.

    Raises:
        ValueError: ``n`` or ``num_classes`` is not positive, or ``n < num_classes``.
    """
    if num_classes < 1 or n < num_classes:
        raise ValueError(f"Need n >= num_classes >= 1, got n={n}, num_classes={num_classes}.")
    if len(size_range) != 4 or size_range[0] > size_range[1] or size_range[2] > size_range[3]:
        raise ValueError(f"size_range must be (min_w, max_w, min_h, max_h), got {tuple(size_range)}.")
    from tqdm.auto import tqdm

    from lightning_gpu_boost.core.cpus import usable_cpus

    root = Path(root)
    spec = {
        "n": n,
        "num_classes": num_classes,
        "size_range": list(size_range),
        "quality": quality,
        "seed": seed,
    }
    marker = root / ".complete.json"
    if marker.exists() and json.loads(marker.read_text()).get("spec") == spec:
        return root
    jobs = []
    for i in range(n):
        class_dir = root / f"class_{i % num_classes:03d}"
        class_dir.mkdir(parents=True, exist_ok=True)
        seed_i = int.from_bytes(hashlib.sha256(f"{seed}/{i}".encode()).digest()[:4], "little")
        jobs.append((str(class_dir / f"img_{i:06d}.jpg"), seed_i))
    workers = min(workers or usable_cpus(), -(-n // _CHUNK))
    args = ([p for p, _ in jobs], [s for _, s in jobs], [tuple(size_range)] * n, [quality] * n)
    bar = {"total": n, "desc": f"demo JPEGs -> {root}", "disable": not progress, "unit": "img"}
    if workers <= 1:  # one task's worth: a pool would only add a process to start
        total = sum(tqdm(map(_synthetic_jpeg, *args), **bar))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            total = sum(tqdm(pool.map(_synthetic_jpeg, *args, chunksize=_CHUNK), **bar))
    marker.write_text(json.dumps({"spec": spec, "bytes": total, "mean_kib": total / n / 1024}))
    return root
