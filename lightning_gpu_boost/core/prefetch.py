"""``StreamPrefetcher``: copy the next batches to the GPU on a side CUDA stream while the current one computes.

Stream hygiene (the rules apex, timm and FFCV converged on, each of which a bug report taught):

1. One side stream per prefetcher, created once (a stream per epoch grows reserved memory).
2. Before each copy the side stream waits for the consumer stream, so a copy never races earlier work that
   the consumer queued on memory the allocator may hand out again.
3. Before a batch is handed over the consumer stream waits for the side stream (an event recorded after
   the copy), so the step never reads a half-copied batch.
4. Every tensor handed over is ``record_stream``-ed on the consumer stream: the caching allocator does not
   reuse its memory until the consumer's queued work on it is done (missing this gives silent NaNs).
5. Source tensors must be pinned, or the "asynchronous" copy is synchronous; unpinned tensors are pinned here
   with a one-time warning (pin in the DataLoader instead: ``pin_memory=True``).

The prefetcher works on any batch structure (tensors, tuples, lists, dicts, namedtuples, dataclasses and
objects with a ``.to()`` method); non-tensor leaves pass through unchanged. On a CPU device it only looks ahead
(no streams), which keeps the same batch order and lets the wrapper's semantics be tested without a GPU.
"""

from __future__ import annotations

import warnings
from abc import ABC
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import torch
from lightning_utilities.core.apply_func import apply_to_collection

from lightning_gpu_boost.core.fork import collect_before_fork
from lightning_gpu_boost.core.handover import BackwardWindow, iter_handover

__all__ = ['DTypeName', 'GPUNormalize', 'StreamPrefetcher', 'as_normalize', 'batch_seed']

DTypeName = Literal["float32", "bfloat16", "float16"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _Transferable(ABC):  # noqa: B024 (a structural check, no abstract methods)
    """Anything with a ``.to()`` method that is not a tensor (e.g. a Hugging Face ``BatchEncoding``)."""

    @classmethod
    def __subclasshook__(cls, subclass: Any) -> Any:
        if cls is _Transferable:
            to = getattr(subclass, "to", None)
            return callable(to)
        return NotImplemented


def as_normalize(normalize: Any, name: str = "normalize") -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(mean, std)`` per channel in [0, 1] units as tuples of floats, checked by
    :func:`~lightning_gpu_boost._checks.check_normalize` (the one check; ``name`` is named in its error)."""
    from lightning_gpu_boost._checks import check_normalize

    check_normalize(name, normalize, allow_none=False)
    mean, std = normalize
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


@dataclass
class GPUNormalize:
    """Turn uint8 image tensors ``(N, C, H, W)`` into normalized floats on the device they are on.

    ``out = (x / 255 - mean) / std`` computed in float32, then cast to ``dtype``; optionally ``channels_last``.
    Which tensors: ``key`` selects one (a dict key or a tuple/list position); ``None`` selects every uint8
    tensor with 4 dimensions.
    """

    mean: Sequence[float]
    std: Sequence[float]
    dtype: DTypeName = "float32"
    channels_last: bool = False
    key: str | int | None = None

    def __post_init__(self) -> None:
        self.mean, self.std = as_normalize((self.mean, self.std))
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}.")
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _consts(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, shift)`` with ``out = x * scale + shift`` = ``(x / 255 - mean) / std``, cached per device."""
        if device not in self._constants:
            std = torch.tensor(self.std, dtype=torch.float64)
            scale, shift = 1.0 / (255.0 * std), -torch.tensor(self.mean, dtype=torch.float64) / std
            f32 = [c.to(torch.float32).view(1, -1, 1, 1).to(device) for c in (scale, shift)]
            self._constants[device] = (f32[0], f32[1])
        return self._constants[device]

    def tensor(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.uint8 or x.dim() != 4:
            raise ValueError(
                f"GPU normalize expects uint8 images of shape (N, C, H, W), got {x.dtype} of shape {tuple(x.shape)}."
            )
        scale, shift = self._consts(x.device)
        if x.shape[1] != scale.shape[1]:
            raise ValueError(f"normalize has {scale.shape[1]} channels but the images have {x.shape[1]}.")
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        out = torch.empty(x.shape, dtype=_DTYPES[self.dtype], device=x.device, memory_format=memory_format)
        # one pass over the data: uint8 in, float32 arithmetic, the output dtype and layout written directly
        return torch.addcmul(shift, x, scale, out=out)

    def __call__(self, batch: Any) -> Any:
        if self.key is None:
            return apply_to_collection(
                batch,
                torch.Tensor,
                lambda t: self.tensor(t) if t.dtype == torch.uint8 and t.dim() == 4 else t,
            )
        if isinstance(batch, dict):
            if self.key not in batch:
                raise KeyError(f"normalize key {self.key!r} is not in the batch (keys: {list(batch)}).")
            return {**batch, self.key: self.tensor(batch[self.key])}
        if isinstance(batch, (list, tuple)) and isinstance(self.key, int):
            items = list(batch)
            items[self.key] = self.tensor(items[self.key])
            return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
        raise TypeError(f"Cannot select {self.key!r} from a batch of type {type(batch).__name__}.")


_warned_unpinned = False


def _pin(t: torch.Tensor) -> torch.Tensor:
    global _warned_unpinned
    if t.device.type != "cpu" or t.is_pinned():
        return t
    if not _warned_unpinned:
        _warned_unpinned = True
        warnings.warn(
            "StreamPrefetcher received unpinned CPU tensors and pins each batch itself, an extra host copy in the "
            "training loop; a DataLoader with workers and pin_memory=True pins in its own thread instead.",
            stacklevel=3,
        )
    return t.pin_memory()


_MASK64 = (1 << 64) - 1


def batch_seed(seed: int, rank: int, epoch: int, index: int) -> int:
    """A seed for one batch's random transform, from the run's ``seed``, the process's ``rank``, the ``epoch`` and
    the batch's ``index`` in it (splitmix64 over the four): the same batch gets the same draws whatever the prefetch
    depth, another rank, epoch or batch gets others. Below 2**63 (``torch.manual_seed`` takes it)."""
    x = 0
    for part in (seed, rank, epoch, index):
        x = (x ^ (int(part) & _MASK64)) + 0x9E3779B97F4A7C15 & _MASK64
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
        x ^= x >> 31
    return x >> 1


#: the most batches a prefetcher copies ahead: each holds its GPU memory, and one or two hide the copy
MAX_DEPTH = 16


class _Begun:
    """A batch handed to the decoder at the fetch: its :meth:`begin` token, for :meth:`end` at the hand-out."""

    __slots__ = ("token",)

    def __init__(self, token: Any) -> None:
        self.token = token


class StreamPrefetcher:
    """Wrap an iterable of batches; iterate it to get the batches on ``device``, copied ``depth`` batches ahead.

    Args:
        loader: any iterable of batches (a ``DataLoader`` usually).
        device: target device (default ``cuda:<current>``). On a CPU device batches pass through unchanged and
            the wrapper only looks ahead.
        depth: batches copied ahead of the one being consumed, ``>= 1``.
        normalize: a :class:`GPUNormalize` applied on the device after the copy (and after ``transform``), or
            ``None``.
        pin: pin unpinned CPU tensors before copying (one warning); ``False`` copies them as they are.
        transform: a callable on the batch on ``device`` (e.g. built from ``torchvision.transforms.v2`` or
            ``kornia.augmentation``), run right after the copy on the side stream, ``depth`` batches ahead, so it
            overlaps the current step. Its random draws come from torch's generators seeded for each batch by
            :func:`batch_seed` (``seed``, ``rank``, the epoch set by :meth:`set_epoch`, the batch's index in the
            epoch) inside ``torch.random.fork_rng``: the same batch gets the same draws whatever ``depth``, and the
            caller's random state is left as it was. It runs before ``normalize`` (which only touches uint8
            images): a transform that returns float images normalizes them itself.
        seed: the run's seed for ``transform``'s draws.
        rank: this process's rank (another rank draws other numbers).
        decode: a callable on the copied batch that decodes what the workers left encoded (a
            :class:`~lightning_gpu_boost.core.gpu_decode.BatchDecoder`), run first after the copy, on the side
            stream; ``None``: nothing to decode. A decoder whose ``asynchronous`` is true is handed each batch
            when it is fetched (``begin``) and gives it decoded when it is handed out (``end``), two batches
            ahead at least; ``discard`` drops what a loop stopped early left.
        window: a :class:`~lightning_gpu_boost.core.handover.BackwardWindow`: the hand-over thread of a decoder
            that begins at the fetch starts each batch's work in it; ``None``: whenever a batch is taken.

    Attribute access and assignment fall through to ``loader`` (``sampler``, ``batch_sampler``, ``dataset``,
    ``worker_init_fn`` ...), ``len()`` is the loader's, and ``state_dict()``/``load_state_dict()`` exist when the
    loader has them: ``state_dict()`` returns the loader's state from when the batch last handed out was fetched,
    not the look-ahead's, so a resumed run neither skips nor repeats a batch.

    Raises:
        ValueError: ``depth`` outside ``[1, MAX_DEPTH]``.

    Example::

        >>> import torch
        >>> batches = [torch.arange(4) + i for i in range(3)]
        >>> [b.tolist() for b in StreamPrefetcher(batches, device="cpu")]
        [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5]]
    """

    _OWN = ("_loader", "_device", "_depth", "_normalize", "_pin", "_stream", "_state", "_iterating", "_transform",
            "_seed", "_rank", "_epoch", "_start", "_decode", "_window")
    #: a decoder that begins at the fetch is driven from a thread of its own (the fetch, the hand-over to the
    #: decoder, the collect and the normalize), so the training thread only takes finished batches (False: in the
    #: training thread; ``benchmarks/gpu_decode.py``'s ``copy_3_inline`` and ``copy_3_handover_thread`` variants)
    _handover_thread = True

    def __new__(cls, loader: Iterable, *args: Any, **kwargs: Any) -> StreamPrefetcher:
        # Stateful loaders get real state_dict/load_state_dict methods: Lightning's `isinstance(x, _Stateful)`
        # protocol check reads class attributes statically (Python 3.12+), so __getattr__ alone is not enough.
        stateful = all(callable(getattr(loader, m, None)) for m in ("state_dict", "load_state_dict"))
        if cls is StreamPrefetcher and stateful:
            cls = _StatefulStreamPrefetcher
        return super().__new__(cls)

    def __init__(
        self,
        loader: Iterable,
        device: torch.device | str | None = None,
        depth: int = 1,
        normalize: GPUNormalize | None = None,
        pin: bool = True,
        transform: Any = None,
        seed: int = 0,
        rank: int = 0,
        decode: Any = None,
        window: BackwardWindow | None = None,
    ) -> None:
        if not isinstance(depth, int) or isinstance(depth, bool) or not 1 <= depth <= MAX_DEPTH:
            raise ValueError(f"depth must be an int in [1, {MAX_DEPTH}], got {depth!r} (each batch ahead holds its "
                             "GPU memory; one or two hide the copy).")  # fmt: skip
        if transform is not None and not callable(transform):
            raise ValueError(f"transform must be a callable on the batch or None, got {transform!r}.")
        for name, value in (("seed", seed), ("rank", rank)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}.")
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        object.__setattr__(self, "_loader", loader)
        object.__setattr__(self, "_device", device)
        object.__setattr__(self, "_depth", depth)
        object.__setattr__(self, "_normalize", normalize)
        object.__setattr__(self, "_pin", pin)
        object.__setattr__(self, "_stream", None)
        object.__setattr__(self, "_state", None)
        object.__setattr__(self, "_iterating", False)
        object.__setattr__(self, "_transform", transform)
        object.__setattr__(self, "_seed", seed)
        object.__setattr__(self, "_rank", rank)
        object.__setattr__(self, "_epoch", 0)
        object.__setattr__(self, "_start", 0)
        object.__setattr__(self, "_decode", decode)
        object.__setattr__(self, "_window", window)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """The epoch the next iteration belongs to (it seeds ``transform``'s draws); also passed on to the loader
        where it has ``set_epoch``. ``start``: the index in the epoch of that iteration's first batch (a loader
        resumed mid-epoch yields batch ``start`` first), so that every batch draws what it would have drawn in an
        uninterrupted epoch; it applies to the next iteration only."""
        object.__setattr__(self, "_epoch", int(epoch))
        object.__setattr__(self, "_start", int(start))

    def _take_start(self) -> int:
        start = self._start
        object.__setattr__(self, "_start", 0)
        return start

    def _apply_transform(self, batch: Any, index: int) -> Any:
        """``transform(batch)`` with torch's generators (CPU, and this CUDA device) seeded for this batch, inside
        ``fork_rng``: the caller's random state is restored afterwards."""
        seed = batch_seed(self._seed, self._rank, self._epoch, index)
        cuda = self._device.type == "cuda"
        with torch.random.fork_rng(devices=[self._device] if cuda else [], device_type="cuda"):
            torch.random.default_generator.manual_seed(seed)
            if cuda:
                torch.cuda.default_generators[self._device.index].manual_seed(seed)
            return self._transform(batch)

    # -- pass-through of the wrapped loader ----------------------------------------------------------------
    @property
    def loader(self) -> Iterable:
        """The wrapped iterable."""
        return self._loader

    @property
    def device(self) -> torch.device:
        return self._device

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name in ("state_dict", "load_state_dict") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._loader, name, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._loader!r}, device={self._device}, depth={self._depth})"

    # -- copying ----------------------------------------------------------------------------------------------
    def _copy(self, batch: Any) -> Any:
        def move(x: Any) -> Any:
            if isinstance(x, bytes):  # a leaf: never walked byte by byte
                return x
            if isinstance(x, torch.Tensor):
                return (_pin(x) if self._pin else x).to(self._device, non_blocking=True)
            return x.to(self._device, non_blocking=True)

        return apply_to_collection(batch, (torch.Tensor, _Transferable, bytes), move)

    @staticmethod
    def _record(batch: Any, stream: torch.cuda.Stream) -> None:
        def record(t: torch.Tensor) -> None:
            if t.is_cuda:
                t.record_stream(stream)

        apply_to_collection(batch, torch.Tensor, record)

    def __iter__(self) -> Iterator[Any]:
        if self._device.type != "cuda":
            yield from self._iter_lookahead()
        else:
            yield from self._iter_cuda()

    def _fetch(self, it: Iterator[Any], queue: deque) -> bool:
        """Fetch one batch into ``queue``; returns ``False`` at the end. Loader errors are queued, not raised."""
        try:
            batch = next(it)
        except StopIteration:
            return False
        except Exception as err:  # re-raised in order, after the batches fetched before it
            queue.append(("error", err, None))
            return False
        state = None
        if isinstance(self, _StatefulStreamPrefetcher):  # a loader whose ranks differ says its own place cheaply
            state = getattr(self._loader, "local_state_dict", self._loader.state_dict)()  # type: ignore[attr-defined]
        queue.append(("batch", batch, state))
        return True

    def _hand_out(self, item: tuple[str, Any, Any]) -> Any:
        kind, value, state = item
        if kind == "error":
            raise value
        object.__setattr__(self, "_state", state)
        return value

    def _iter_lookahead(self) -> Iterator[Any]:
        queue: deque = deque()
        it = iter(self._loader)
        object.__setattr__(self, "_iterating", True)
        index = self._take_start()
        try:
            alive = True
            while alive and len(queue) < self._depth:
                alive = self._fetch(it, queue)
            while queue:
                batch = self._hand_out(queue.popleft())
                if self._decode is not None:
                    batch = self._decode(batch)
                if self._transform is not None:
                    batch = self._apply_transform(batch, index)
                index += 1
                if self._normalize is not None:
                    batch = self._normalize(batch)
                if alive:
                    alive = self._fetch(it, queue)
                yield batch
        finally:
            object.__setattr__(self, "_iterating", False)
            object.__setattr__(self, "_state", None)

    def _iter_cuda(self) -> Iterator[Any]:
        device = self._device
        if self._stream is None:
            # a batch decoded on the GPU runs its many small kernels beside the step's large ones: at the highest
            # priority they take the multiprocessors as the step's blocks free them, instead of queueing behind it
            # (issue 63: beside ResNet-50 a decode ran 8-9x slower than alone, at equal priority)
            priority = -1 if self._decode is not None else 0
            object.__setattr__(self, "_stream", torch.cuda.Stream(device=device, priority=priority))
        side: torch.cuda.Stream = self._stream
        queue: deque = deque()  # items: (kind, batch on GPU, loader state, ready event)
        collect_before_fork(self._loader)  # no earlier fit's CUDA memory left for forked workers to free
        it = iter(self._loader)
        fetched = self._take_start()  # the next batch's index in the epoch

        # a decoder that begins at the fetch (DALI's pipelines) is handed each batch when it is fetched and gives the
        # images when it is handed out, a batch ahead per pipeline, from a thread of ours (H200, ResNet-18: the step
        # then waited for data 0.05 of its time, 0.28-0.30 where the training thread handed over between steps).
        # Otherwise the decode runs in a thread of its own, on the side stream: the training loop launches the step
        # meanwhile; with a transform (its seeded draws fork torch's global generators) inline
        begins = self._decode is not None and self._transform is None and getattr(self._decode, "asynchronous", False)
        ahead = max(self._depth, getattr(self._decode, "ahead", 2)) if begins else self._depth
        if begins and self._handover_thread:
            yield from iter_handover(self, it, side, ahead, self._window)
            return
        thread = ThreadPoolExecutor(1, thread_name_prefix="lgb-decode") if (
            self._decode is not None and self._transform is None and not begins) else None  # fmt: skip

        def copy_and_decode(batch: Any) -> tuple[Any, torch.cuda.Event]:
            with torch.cuda.device(device), torch.cuda.stream(side):
                batch = self._decode(self._copy(batch))
                if self._normalize is not None:  # deterministic: no generator to fork, safe in the thread
                    batch = self._normalize(batch)
                ready = torch.cuda.Event()
                ready.record(side)
            return batch, ready

        def fetch_and_copy() -> bool:
            nonlocal fetched
            alive = self._fetch(it, queue)
            if alive:
                kind, batch, state = queue.pop()
                consumer = torch.cuda.current_stream(device)
                side.wait_stream(consumer)
                if begins:
                    fetched += 1
                    queue.append((kind, self._begin(batch, side), state, None))
                    return alive
                if thread is not None:
                    fetched += 1
                    queue.append((kind, thread.submit(copy_and_decode, batch), state, None))
                    return alive
                with torch.cuda.stream(side):
                    batch = self._copy(batch)
                    if self._decode is not None:
                        batch = self._decode(batch)
                    if self._transform is not None:  # on the side stream, overlapping the current step
                        batch = self._apply_transform(batch, fetched)
                    fetched += 1
                    if self._normalize is not None:
                        batch = self._normalize(batch)
                    ready = torch.cuda.Event()
                    ready.record(side)
                queue.append((kind, batch, state, ready))
            return alive

        object.__setattr__(self, "_iterating", True)
        try:
            alive = True
            while alive and len(queue) < ahead:
                alive = fetch_and_copy()
            while queue:
                item = queue.popleft()
                if item[0] == "error":
                    raise item[1]
                kind, batch, state, ready = item
                if isinstance(batch, _Begun):  # the decoder's images now, on the side stream
                    batch, ready = self._end(batch, side)
                elif ready is None:  # decoded in the thread
                    batch, ready = batch.result()
                consumer = torch.cuda.current_stream(device)
                consumer.wait_event(ready)
                self._record(batch, consumer)
                object.__setattr__(self, "_state", state)
                if alive:
                    alive = fetch_and_copy()
                yield batch
        finally:
            object.__setattr__(self, "_iterating", False)
            object.__setattr__(self, "_state", None)
            if thread is not None:
                thread.shutdown(wait=True, cancel_futures=True)
            for item in queue:  # batches begun and not handed out (a loop stopped early): the decoder drops them
                if isinstance(item[1], _Begun):
                    self._decode.discard(item[1].token)

    def _begin(self, batch: Any, side: torch.cuda.Stream) -> _Begun:
        """The fetched batch copied on the side stream and handed to the decoder that begins at the fetch."""
        with torch.cuda.stream(side):
            batch = self._copy(batch)
        return _Begun(self._decode.begin(batch))

    def _end(self, begun: _Begun, side: torch.cuda.Stream) -> tuple[Any, torch.cuda.Event]:
        """A begun batch's images from the decoder, normalized, on the side stream; the event after them."""
        with torch.cuda.stream(side):
            batch = self._decode.end(begun.token)
            if self._normalize is not None:
                batch = self._normalize(batch)
            ready = torch.cuda.Event()
            ready.record(side)
        return batch, ready


class _StatefulStreamPrefetcher(StreamPrefetcher):
    """A :class:`StreamPrefetcher` over a loader with ``state_dict``/``load_state_dict``."""

    def state_dict(self) -> dict[str, Any]:
        """The loader's state from when the batch last handed out was fetched (not the look-ahead's)."""
        if self._iterating and self._state is not None:
            if callable(getattr(self._loader, "local_state_dict", None)):  # every rank's place, as the loader's own
                from lightning_gpu_boost.core.resume import gather_ranks

                return gather_ranks(self._state)
            return self._state
        return self._loader.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "_state", None)
        self._loader.load_state_dict(state)  # type: ignore[attr-defined]
