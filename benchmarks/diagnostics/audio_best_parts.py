"""Diagnosis: where the ``audio`` workload's documented best loses to its ceiling (the step on one resident batch),
by taking the best's parts away one at a time, each case run through the workloads runner (``fit``), in turn:

- ``ceiling``: the runner's ceiling (the plain loader's first batch, features made in its workers, resident);
- ``varying_features``: 16 of the worker path's batches (``workers`` below), their features made once on the GPU (``LogMel(pad_to=64)``),
  resident and cycled: the ceiling plus the best's batch shapes;
- ``resident_waves``: the same 16 batches as waveforms in pinned memory, cycled through ``GPUBoost(transform=
  LogMel(...))``: copy, features and shapes per step, but no worker processes or pin-memory thread;
- ``best``: the documented best (on a GPU with DALI: ``_best.DALIFeatures``, log-mel computed by DALI end to end);
- ``dali_loader``: ``DALILoader`` with ``audio_graph`` (exact epochs), resampling and features by ``LogMel`` through
  GPUBoost's transform (the best until 2026-11-24's last runs);
- ``dali_reader``: DALI's own file reader and iterator (``DALIReaderAudio``: no Python per file or per
  batch fed), resampling and features on the GPU;
- ``dali_features``: the same as ``best``, as a named case;
- ``dali_16k``: the same, DALI resampling to 16 kHz in its CPU threads;
- ``dali_depth4``, ``dali_4_pipelines``: the best with DALI computing 4 batches ahead per pipeline, or with 4
  pipelines (2 in the best);
- ``dali_4_threads``, ``dali_1_pipeline``: the best with 4 DALI CPU threads in all (15 in the best), or one pipeline;
- ``dali_unthreaded``: the best without DALILoader's producer thread (the training thread takes DALI's outputs);
- ``dali_switch``: the best with Python's GIL switch interval at 0.5 ms (5 ms by default: a thread that holds the GIL
  keeps the training thread waiting up to that long);
- ``workers``: the best without DALI (4 workers reading the waveforms and resampling them to 16 kHz, the features
  on the GPU);
- ``workers_44k``: the workers send the waveforms at 44.1 kHz, resampled on the GPU (2.75x the bytes per batch
  through shared memory, pinning and the copy);
- ``workers_8``: ``workers`` with 8 workers;
- ``workers_file_system``: ``workers`` with torch's ``file_system`` sharing strategy (tensors found by name, no
  file descriptor sent over a socket per tensor by the pin thread);
- ``workers_unpinned``: ``workers`` without the loader's pin-memory thread (the prefetcher pins each batch in the
  training thread);
- ``threads``: no worker processes: 4 threads of the training process read, resample and pad each batch into
  pinned memory (no shared memory, no pickling, no pin-memory thread; the threads need the GIL only between the
  file reads and torch's kernels).

    cd benchmarks/diagnostics && python audio_best_parts.py --data /tmp/wl --rounds 2
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import itertools
import statistics
import sys
from pathlib import Path

import torch

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
sys.path.insert(0, str(WORKLOADS))

import _best  # noqa: E402
from _common import RESULTS  # noqa: E402

from lightning_gpu_boost.callbacks import GPUBoost  # noqa: E402
from lightning_gpu_boost.core.results import write_result  # noqa: E402

CASES = ("ceiling", "varying_features", "resident_waves", "best", "dali_loader", "dali_reader", "dali_features", "dali_16k", "dali_depth4", "dali_4_pipelines",
         "dali_4_threads", "dali_1_pipeline", "dali_unthreaded", "dali_switch", "workers", "workers_44k", "workers_8",
         "workers_file_system", "workers_unpinned", "threads")  # fmt: skip


class Cycle:
    """``batches`` over and over, ``length`` per epoch."""

    def __init__(self, batches: list, length: int) -> None:
        self.batches, self.length = batches, length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        return itertools.islice(itertools.cycle(self.batches), self.length)


def _parts(data: Path, size: str, features: bool):
    # the worker path's batches (waveforms at 16 kHz) and its LogMel: these parts take the worker best apart
    model, loader, val, kwargs, callbacks = _variant(data, size, "workers")
    mel = callbacks[0].parts["prefetch"].transform
    batches = list(itertools.islice(iter(loader), 16))
    getattr(loader, "close", lambda: None)()  # a DALILoader's threads and pipelines
    del loader
    if features:
        device = torch.device("cuda")
        made = [mel(tuple(t.to(device) for t in b)) for b in batches]
        return model, Cycle(made, 10_000), val, kwargs, [GPUBoost(prefetch=False, auto_workers=False, watchdog=False)]
    return model, Cycle(batches, 10_000), val, kwargs, [GPUBoost(transform=mel, auto_workers=False)]


class Unwrapped:
    """A DataLoader behind a plain iterable: ``StreamPrefetch`` leaves its ``pin_memory`` as it is."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        return iter(self.loader)


class ThreadBatches:
    """Shuffled batches of ``dataset`` made by ``threads`` threads of this process, ``ahead`` batches ahead, each
    collated and pinned in its thread."""

    def __init__(self, dataset, batch_size: int, collate, threads: int = 4, ahead: int = 8) -> None:
        self.dataset, self.batch_size, self.collate = dataset, batch_size, collate
        self.threads, self.ahead = threads, ahead
        self.pool = None

    def __len__(self) -> int:
        return len(self.dataset) // self.batch_size

    def _make(self, indices):
        batch = self.collate([self.dataset[i] for i in indices])
        return tuple(t.pin_memory() for t in batch) if torch.cuda.is_available() else batch

    def __iter__(self):
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.threads)
        order = torch.randperm(len(self.dataset)).tolist()
        batches = iter([order[i : i + self.batch_size] for i in range(0, len(self) * self.batch_size, self.batch_size)])
        pending = deque(self.pool.submit(self._make, b) for b in itertools.islice(batches, self.ahead))
        while pending:
            batch = pending.popleft().result()
            for b in itertools.islice(batches, 1):
                pending.append(self.pool.submit(self._make, b))
            yield batch


class DALIReaderAudio:
    """The audio clips through a plain DALI pipeline, as NVIDIA's and NeMo's DALI examples write one:
    ``fn.readers.file`` (shuffled anew each epoch) and ``fn.decoders.audio`` in DALI's threads, padded on the GPU,
    ``DALIGenericIterator``; batches ``(waveforms int16 N x T, lengths, labels)`` already on the GPU. No Python runs
    per sample or per file: only taking each batch (where ``DALILoader``'s external source feeds every batch from
    Python, for its exact epochs, DDP shards and resumes)."""

    batches_on_device = True

    def __init__(self, files: list[Path], labels: list[int], batch_size: int, device_id: int | None,
                 threads: int) -> None:  # fmt: skip
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=device_id, seed=0)
        def clips():
            encoded, label = fn.readers.file(files=[str(f) for f in files], labels=labels, shuffle_after_epoch=True,
                                             name="reader")  # fmt: skip
            audio, _ = fn.decoders.audio(encoded, dtype=types.INT16, downmix=True)
            lengths = fn.reshape(audio.shape(dtype=types.INT64), shape=[])
            if device_id is None:  # a CPU pipeline (a check on a machine without a GPU)
                return fn.pad(audio, fill_value=0), lengths, label
            return fn.pad(audio.gpu(), fill_value=0), lengths.gpu(), label.gpu()

        pipe = clips()
        pipe.build()
        self.iterator = DALIGenericIterator([pipe], ["audio", "lengths", "labels"], reader_name="reader",
                                            last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)  # fmt: skip

    def __len__(self) -> int:
        return len(self.iterator)

    def __iter__(self):
        for (out,) in self.iterator:
            yield out["audio"], out["lengths"], out["labels"].reshape(-1).long()


def _variant(data: Path, size: str, case: str):
    import audio as w

    from lightning_gpu_boost.core.cpus import usable_cpus
    from lightning_gpu_boost.core.dali import DALILoader, FileListSource, audio_graph
    from lightning_gpu_boost.core.gpu_transforms import LogMel

    cfg = w.SIZES[size]
    model, _, val, kwargs = w.build(data, size)
    mel = LogMel(source_rate=w.RATE, rate=w.RATE, n_fft=w.N_FFT, hop=w.HOP, n_mels=w.MELS, pad_to=64)
    boost = [GPUBoost(transform=mel, auto_workers=False)]
    if case == "dali_features":
        files = sorted(Path(data).glob("*.wav"))
        loader = _best.DALIFeatures(files, [i % 10 for i in range(len(files))], cfg["batch"], torch.cuda.current_device(),
                              max(1, usable_cpus() - 1), w.SOURCE_RATE, w.RATE, w.N_FFT, w.HOP, w.MELS)  # fmt: skip
        return model, loader, val, kwargs, [GPUBoost(prefetch=False, auto_workers=False, watchdog=False)]
    if case == "dali_reader":
        files = sorted(Path(data).glob("*.wav"))
        mel = LogMel(source_rate=w.SOURCE_RATE, rate=w.RATE, n_fft=w.N_FFT, hop=w.HOP, n_mels=w.MELS, pad_to=64)
        loader = DALIReaderAudio(files, [i % 10 for i in range(len(files))], cfg["batch"],
                                       torch.cuda.current_device(), max(1, usable_cpus() - 1))  # fmt: skip
        return model, loader, val, kwargs, [GPUBoost(transform=mel, auto_workers=False)]
    if case.startswith("dali_"):  # DALILoader (the best before DALIFeatures) and its variants
        files = sorted(Path(data).glob("*.wav"))
        rate = {"sample_rate": w.RATE} if case == "dali_16k" else {}
        if not rate:
            mel = LogMel(source_rate=w.SOURCE_RATE, rate=w.RATE, n_fft=w.N_FFT, hop=w.HOP, n_mels=w.MELS, pad_to=64)
            boost = [GPUBoost(transform=mel, auto_workers=False)]
        loader = DALILoader(FileListSource(files, [i % 10 for i in range(len(files))]),
                            functools.partial(audio_graph, gpu=True, **rate), cfg["batch"],
                            device_id=torch.cuda.current_device(),
                            num_threads=4 if case == "dali_4_threads" else max(1, usable_cpus() - 1), drop_last=True,
                            pipelines={"dali_4_pipelines": 4, "dali_1_pipeline": 1}.get(case, 2),
                            prefetch_queue_depth=4 if case == "dali_depth4" else 2)  # fmt: skip
        loader._threaded = case != "dali_unthreaded"
        return model, loader, val, kwargs, boost
    dataset = _best.Waves(data, w.SOURCE_RATE, w.RATE)
    if case == "workers_44k":
        dataset = _best.Waves(data)
        mel = LogMel(source_rate=w.SOURCE_RATE, rate=w.RATE, n_fft=w.N_FFT, hop=w.HOP, n_mels=w.MELS, pad_to=64)
        boost = [GPUBoost(transform=mel, auto_workers=False)]
    if case == "threads":
        return model, ThreadBatches(dataset, cfg["batch"], _best.pad_waves), val, kwargs, boost
    workers = 8 if case == "workers_8" else cfg["workers"]
    loader = torch.utils.data.DataLoader(dataset, batch_size=cfg["batch"], shuffle=True, num_workers=workers,
                                         pin_memory=case != "workers_unpinned", collate_fn=_best.pad_waves,
                                         drop_last=True, persistent_workers=True)  # fmt: skip
    return model, Unwrapped(loader) if case == "workers_unpinned" else loader, val, kwargs, boost


def _loader_alone(data: Path, batches: int = 200) -> float:
    """Samples per second of the best's loader and transform alone (no training), after 20 batches."""
    import time

    import audio as w

    _, loader, _, _, callbacks = _best.audio(w.prepare(data, "gpu"), "gpu")
    prefetch = callbacks[0].parts.get("prefetch")
    mel = prefetch.transform if prefetch is not None and prefetch.transform is not None else (lambda batch: batch)
    it = iter(loader)
    for _ in range(20):
        mel(next(it))
    torch.cuda.synchronize()
    started, n = time.perf_counter(), 0
    for _ in range(batches):
        n += len(mel(next(it))[-1])
    torch.cuda.synchronize()
    rate = n / (time.perf_counter() - started)
    getattr(loader, "close", lambda: None)()
    print(f"best's loader alone: {rate:,.0f} samples/s", flush=True)
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="/tmp/wl")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--out", default=RESULTS, help="the results folder (default: benchmarks/results)")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("workloads_main", WORKLOADS / "__main__.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    best = _best.BEST["audio"]
    cases = args.cases if "ceiling" in args.cases else ["ceiling", *args.cases]
    rates: dict[str, list[float]] = {c: [] for c in cases}
    steps: dict[str, list[float]] = {c: [] for c in cases}
    for _ in range(args.rounds):
        for case in cases:
            if case == "ceiling":
                r = runner.fit("audio", "gpu", Path(args.data), "ceiling")
            else:
                if case == "best":
                    _best.BEST["audio"] = best
                elif case not in ("varying_features", "resident_waves"):
                    _best.BEST["audio"] = lambda d, s, c=case: _variant(d, s, c)
                else:
                    _best.BEST["audio"] = lambda d, s, f=case == "varying_features": _parts(d, s, f)
                strategy, interval = torch.multiprocessing.get_sharing_strategy(), sys.getswitchinterval()
                if case == "dali_switch":
                    sys.setswitchinterval(0.0005)
                if case == "workers_file_system":
                    torch.multiprocessing.set_sharing_strategy("file_system")
                try:
                    r = runner.fit("audio", "gpu", Path(args.data), "best")
                finally:
                    torch.multiprocessing.set_sharing_strategy(strategy)
                    sys.setswitchinterval(interval)
            rates[case].append(r["throughput"]["samples_per_s"])
            steps[case].append(r["watchdog"].get("step_ms", float("nan")))
            print(f"{case}: {rates[case][-1]:,.0f} samples/s, step {steps[case][-1]:.1f} ms", flush=True)
    _best.BEST["audio"] = best
    alone = _loader_alone(Path(args.data)) if "best" in cases else None
    figures = {"best_loader_alone_samples_per_s": alone, "config": vars(args), "samples_per_s": rates, "step_ms": steps,
               "median_of_ceiling": {c: statistics.median(rates[c]) / statistics.median(rates["ceiling"])
                                     for c in cases}}  # fmt: skip
    print(figures["median_of_ceiling"])
    print(f"wrote {write_result('audio_best_parts', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
