"""litdata's dataset and loader with our checks where a stream is read: every sample checked, every stall reported,
every resume with other settings refused.

- :class:`CheckedStream` (a ``StreamingDataset``): a sample that cannot be used (its checksum does not match, its
  record does not parse, its image does not decode) is named by its object (the chunk), its place in the stream and
  the cause, then raised (``bad_samples="raise"``) or skipped (``"skip"``: a
  :class:`~lightning_gpu_boost.core.bad_samples.BadSample` that ``SkipBadCollate`` drops, counted across workers). A
  sample that waits longer than ``stall_s`` for its bytes is reported at once from the worker, naming the object and
  the endpoint; a failed or timed-out download ends in one error naming them too, not a local cache path.
- :class:`CheckedStreamLoader` (a ``StreamingDataLoader``): a saved place whose worker count, batch size, world size,
  stream or shuffle differs from this run's is refused with one line naming the setting and both values (litdata's
  order of samples depends on them: a run resumed with another worker count would not see the batches the
  uninterrupted run sees).

Imports litdata (the ``stream`` extra): import this module only where a stream is read.
"""

from __future__ import annotations

import bisect
import itertools
import os
import pickle
import struct
import sys
import threading
import time
import weakref
from typing import Any, Literal

from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming.sampler import ChunkedIndex

from lightning_gpu_boost.core.bad_samples import BadSample, BadSampleError, BadSampleTracker
from lightning_gpu_boost.core.streaming.images import StreamSampleError

__all__ = ["CheckedStream", "CheckedStreamLoader", "StreamReadError", "DEFAULT_STALL_S"]

#: seconds a sample may wait for its bytes before the stall is reported (the issue's bound is 30 s)
DEFAULT_STALL_S = 20.0

#: what a damaged record raises while litdata parses it (its sizes, offsets or serialized fields)
_RECORD_ERRORS = (struct.error, ValueError, IndexError, KeyError, TypeError, OverflowError, EOFError, MemoryError,
                  UnicodeDecodeError, pickle.UnpicklingError, AssertionError)  # fmt: skip


class StreamReadError(RuntimeError):
    """A stream's object could not be read: the message names the object, the endpoint and the cause."""


def endpoint_of(url: str, storage_options: dict[str, Any] | None) -> str:
    """Where ``url``'s objects come from, for messages: the endpoint URL, AWS's default, or the local folder."""
    from lightning_gpu_boost.core.streaming.source import _endpoint

    if "://" not in url or url.startswith("file://"):
        return "the local disk"
    return _endpoint(storage_options) or "AWS's default endpoint"


class _StallMonitor:
    """One thread per worker process: reports a read that has waited longer than ``stall_s`` (once per read). It
    holds its dataset weakly and ends when the dataset goes."""

    def __init__(self, stall_s: float, owner: CheckedStream) -> None:
        self.stall_s, self._owner = stall_s, weakref.ref(owner)
        self.busy: tuple[float, Any] | None = None  # (monotonic start, the ChunkedIndex) of the read under way
        self._reported: Any = None
        threading.Thread(target=self._watch, name="lgb-stream-stall", daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.stall_s / 4))
            busy, owner = self.busy, self._owner()
            if owner is None:
                return
            if busy is not None and busy is not self._reported and time.monotonic() - busy[0] >= self.stall_s:
                self._reported = busy
                # printed, not warned: a worker inherits its parent's warning filters and catchers (a test's, a
                # notebook's), which would keep the line from the user
                print(f"lightning-gpu-boost: stream stalled: a sample has waited {time.monotonic() - busy[0]:.0f} s "
                      f"for {owner._describe(busy[1])}; still retrying.", file=sys.stderr, flush=True)  # fmt: skip
            del owner


class CheckedStream(StreamingDataset):
    """litdata's ``StreamingDataset`` whose samples are checked where they are read (see the module's doc).

    Args:
        url: the stream (``s3://bucket/prefix`` or a local folder).
        chunks: the chunks' file names in the index's order, and ``chunk_samples`` the samples in each (from
            :func:`~lightning_gpu_boost.core.streaming.check_stream_source`); ``None``: chunks are named by number.
        bad_samples: ``"raise"`` a :class:`~lightning_gpu_boost.core.bad_samples.BadSampleError` naming the object,
            the sample and the cause, or ``"skip"`` the sample.
        stall_s: seconds a sample may wait for its bytes before the stall is reported.
        **kwargs: ``StreamingDataset``'s.
    """

    def __init__(self, url: str, *, chunks: list[str] | None = None, chunk_samples: list[int] | None = None,
                 bad_samples: Literal["raise", "skip"] = "raise", stall_s: float = DEFAULT_STALL_S,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(url, **kwargs)
        self.url, self.chunks, self.bad_samples, self.stall_s = url, list(chunks or []), bad_samples, float(stall_s)
        self._starts = list(itertools.accumulate([0, *(chunk_samples or [])]))[:-1]
        self.endpoint = endpoint_of(url, kwargs.get("storage_options"))
        #: counts of skipped samples per stream index (``bad_samples="skip"`` only: shared memory, seen by workers)
        self.bad_sample_tracker = BadSampleTracker(len(self)) if bad_samples == "skip" else None
        self._monitor: _StallMonitor | None = None
        self._monitor_pid = -1

    def __getstate__(self) -> dict[str, Any]:  # a worker started by spawn starts its own monitor
        state = self.__dict__.copy()
        state["_monitor"], state["_monitor_pid"] = None, -1
        return state

    def chunk_name(self, chunk_index: int) -> str:
        return self.chunks[chunk_index] if 0 <= chunk_index < len(self.chunks) else f"chunk #{chunk_index}"

    def object_of(self, index: Any) -> str:
        """The object holding sample ``index`` (a ``ChunkedIndex``, or a stream index), with the stream's URL."""
        if isinstance(index, ChunkedIndex):
            chunk = index.chunk_index
        else:
            chunk = max(0, bisect.bisect_right(self._starts, int(index)) - 1) if self._starts else -1
        return f"{self.url.rstrip('/')}/{self.chunk_name(chunk)}"

    def sample_path(self, index: int) -> str:
        """Sample ``index`` of the stream, named by its object (what the skip warnings list)."""
        return f"{self.object_of(index)} (sample {index})"

    def _describe(self, index: Any) -> str:
        return f"{self.object_of(index)} from {self.endpoint}"

    def _watch(self, index: Any) -> None:
        if self._monitor is None or self._monitor_pid != os.getpid():
            self._monitor, self._monitor_pid = _StallMonitor(self.stall_s, self), os.getpid()
        self._monitor.busy = (time.monotonic(), index)

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, ChunkedIndex):  # a direct read (dataset[i]): litdata's, unchecked by place
            return super().__getitem__(index)
        self._watch(index)
        try:
            return super().__getitem__(index)
        except StreamSampleError as err:
            problem = str(err)
        except _RECORD_ERRORS as err:
            problem = f"its record does not parse ({type(err).__name__}: {err})"
        except Exception as err:
            waited = time.monotonic() - self._monitor.busy[0] if self._monitor and self._monitor.busy else 0.0
            cause = f"{type(err).__name__}: {err}"
            if isinstance(err, FileNotFoundError) and "ChunkWait" in type(err).__name__:
                cause = f"no complete copy after {waited:.0f} s of waiting (litdata's MAX_WAIT_TIME) and retrying"
            raise StreamReadError(f"Cannot read {self._describe(index)}: {cause}. Check that the object exists "
                                  "and the endpoint answers.") from err  # fmt: skip
        finally:
            if self._monitor is not None:
                self._monitor.busy = None
        return self._bad(index, problem)

    def _bad(self, index: ChunkedIndex, problem: str) -> BadSample:
        where = f"sample {index.index} of {self.object_of(index)}"
        if self.bad_samples == "raise":
            raise BadSampleError(f"Cannot use {where}: {problem}. Write the stream again (write_image_stream), or "
                                 "pass bad_samples='skip' to drop bad samples from their batches.")  # fmt: skip
        assert self.bad_sample_tracker is not None
        self.bad_sample_tracker.mark(index.index)
        return BadSample(index.index, self.object_of(index), problem)


#: a saved place's settings that litdata's order of samples depends on: (key in litdata's state, name for messages)
_PLACE_SETTINGS = (("num_workers", "num_workers"), ("batch_size", "batch_size"), ("world_size", "world size"),
                   ("input_dir_url", "stream"), ("shuffle", "shuffle"), ("seed", "seed"), ("drop_last", "drop_last"))  # fmt: skip


class CheckedStreamLoader(StreamingDataLoader):
    """litdata's ``StreamingDataLoader`` that refuses a saved place taken with other settings (see the module's
    doc) and reports the bad samples each pass skipped through :attr:`bad_sample_log`."""

    #: where this loader reports the bad samples each pass skipped (``None``: not reported)
    bad_sample_log: Any = None

    def __iter__(self) -> Any:
        log = self.bad_sample_log
        batches = super().__iter__()
        if log is None:
            yield from batches
        else:
            yield from log.watch(batches)

    def _current(self) -> dict[str, Any]:
        from litdata.utilities.env import _DistributedEnv

        dataset = self.dataset
        return {"num_workers": self.num_workers or 1, "batch_size": self.batch_size,
                "world_size": _DistributedEnv.detect().world_size,
                "input_dir_url": getattr(dataset.input_dir, "url", None) or getattr(dataset.input_dir, "path", None),
                "shuffle": dataset.shuffle, "seed": dataset.seed, "drop_last": dataset.drop_last}  # fmt: skip

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        saved = obj.get("dataset") if isinstance(obj, dict) else None
        if isinstance(saved, dict) and isinstance(self.dataset, StreamingDataset):
            now = self._current()
            for key, name in _PLACE_SETTINGS:
                if key == "input_dir_url" and saved.get(key) is None:
                    was = saved.get("input_dir_path")
                else:
                    was = saved.get(key)
                if was is not None and key in now and was != now[key]:
                    raise ValueError(
                        f"Cannot resume this stream's place: it was saved with {name}={was!r} and this run has "
                        f"{name}={now[key]!r} (litdata's order of samples depends on it, so the run would repeat "
                        f"and skip samples). Resume with {name}={was!r}, or start a new run."
                    )
        super().load_state_dict(obj)
