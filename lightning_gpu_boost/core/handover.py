"""The hand-over thread: a decoder that begins at the fetch (DALI's pipelines) driven from a thread of its own, so
the training thread only takes finished batches, and the window it works in (:class:`BackwardWindow`).

A small step (ResNet-18 on an H200) is bound by its launches: the training thread needs most of the step to launch
its kernels, and every millisecond another thread of the process holds the GIL the GPU waits. While the training
thread is in ``loss.backward()`` it holds no GIL (autograd's engine launches the backward from a thread of its
own): the hand-over thread starts each batch's work (the fetch, the hand-over to the decoder, the collect) then.
"""

from __future__ import annotations

import queue as queues
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ['BackwardWindow', 'iter_handover']


class BackwardWindow:
    """When the hand-over thread starts a batch's work: while the training thread is in ``backward``.

    Framework-free: whoever runs the training loop calls :meth:`open` as each backward begins and :meth:`close` as
    it ends (``StreamPrefetch`` does it from ``on_before_backward``/``on_after_backward``), and :meth:`finish`
    when training ends. The thread waits for it only while a finished batch waits for the training thread (never
    while the training thread waits), at most ``timeout_s``: a window that opens late (a forward that waits for the
    GPU's queue) costs that wait; after ``misses`` waits in a row that timed out with no backward reported since the
    wait before (a loop whose backward nobody reports) the window stays open.

    Args:
        timeout_s: the longest one wait, in seconds, ``> 0``.
        misses: timed-out waits in a row, no backward reported between them, after which the window stays open,
            ``>= 1``.

    Raises:
        ValueError: ``timeout_s`` or ``misses`` out of range.

    Example::

        >>> window = BackwardWindow()
        >>> window.close(); window.wait(); window.figures()["timeouts"]
        1
        >>> window.open(); window.wait(); window.figures()["waits"]
        2
    """

    def __init__(self, timeout_s: float = 0.025, misses: int = 3) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}.")
        if isinstance(misses, bool) or not isinstance(misses, int) or misses < 1:
            raise ValueError(f"misses must be an int >= 1, got {misses!r}.")
        self.timeout_s, self.misses = float(timeout_s), misses
        self._opened = threading.Event()
        self._opened.set()
        self._missed = 0  # timed-out waits in a row with no backward reported between them
        self._opens, self._opens_seen = 0, 0  # backwards reported; as the last wait saw them
        self.waits, self.waited_s, self.timeouts = 0, 0.0, 0
        #: why the window stays open for good (None while it gates)
        self.off: str | None = None

    def open(self) -> None:
        self._opens += 1
        self._opened.set()

    def close(self) -> None:
        if self.off is None:
            self._opened.clear()

    def finish(self) -> None:
        """Training ended: the window stays open."""
        self.off = self.off or "training ended"
        self._opened.set()

    def wait(self) -> None:
        """In the hand-over thread, before a batch's work: until the window opens, at most ``timeout_s``."""
        if self.off is not None:
            return
        t0 = time.perf_counter()
        opened = self._opened.wait(self.timeout_s)
        self.waits += 1
        self.waited_s += time.perf_counter() - t0
        reported, self._opens_seen = self._opens != self._opens_seen, self._opens
        if opened:
            self._missed = 0
            return
        self.timeouts += 1
        self._missed = 0 if reported else self._missed + 1
        if self._missed >= self.misses:
            self.off = (f"{self.misses} waits in a row timed out ({1000 * self.timeout_s:g} ms each) with no backward "
                        "reported")  # fmt: skip
            self._opened.set()

    def figures(self) -> dict[str, Any]:
        """How often and how long the thread waited, how often in vain, and why it stopped waiting."""
        return {"waits": self.waits, "waited_ms_mean": round(1000 * self.waited_s / max(1, self.waits), 3),
                "timeouts": self.timeouts, "off": self.off}  # fmt: skip


def iter_handover(prefetcher: Any, it: Iterator[Any], side: torch.cuda.Stream, ahead: int,
                  window: BackwardWindow | None = None) -> Iterator[Any]:  # fmt: skip
    """A :class:`~lightning_gpu_boost.core.prefetch.StreamPrefetcher`'s batches of a decoder that begins at the
    fetch, fetched, handed to it, collected and normalized in a thread of their own (``lgb-handover``), ``ahead``
    batches begun and one finished ahead, each batch's work started in ``window`` where given (while the training
    thread has a finished batch to take); the training thread
    makes its stream wait for each batch's event, records the batch on it and sets the loader's state as it hands
    the batch out. Each batch carries the decoder's facts about it (share, when and by which worker it was made),
    set on the decoder as it is handed out (``handed_out``): the thread has decoded the next one by then."""
    p = prefetcher
    device, consumer = p._device, torch.cuda.current_stream(p._device)
    done: queues.Queue = queues.Queue(maxsize=1)
    stop = threading.Event()

    def put(item: tuple[str, Any, Any]) -> bool:
        while not stop.is_set():
            try:
                done.put(item, timeout=0.1)
                return True
            except queues.Full:
                continue
        return False

    def produce() -> None:
        begun: deque = deque()
        try:
            torch.cuda.set_device(device)
            alive = True
            while True:
                while alive and len(begun) < ahead and not stop.is_set():
                    if window is not None and done.full():  # a finished batch waits: the training thread is busy
                        window.wait()
                    fetched: deque = deque()
                    alive = p._fetch(it, fetched)
                    if fetched and fetched[0][0] == "error":
                        begun.append(fetched.pop())
                    elif fetched:
                        _, batch, state = fetched.pop()
                        side.wait_stream(consumer)
                        begun.append(("batch", p._begin(batch, side), state))
                if not begun or stop.is_set():
                    break
                kind, value, state = begun.popleft()
                if kind == "error":
                    put((kind, value, state))
                    break
                batch, ready = p._end(value, side)
                facts = tuple(getattr(p._decode, n, None) for n in ("last_share", "last_made_at", "last_made_by",
                                                                    "last_engine_load"))  # fmt: skip
                if not put(("batch", (batch, ready, facts), state)):
                    break
            put(("end", None, None))
        except BaseException as err:  # raised in the training thread, after the batches before it
            put(("error", err, None))
        finally:
            for kind, value, _ in begun:  # begun and not handed out (a loop stopped early): the decoder drops them
                if kind == "batch":
                    p._decode.discard(value.token)

    thread = threading.Thread(target=produce, name="lgb-handover", daemon=True)
    object.__setattr__(p, "_iterating", True)
    thread.start()
    try:
        while True:
            kind, value, state = done.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            batch, ready, facts = value
            current = torch.cuda.current_stream(device)
            current.wait_event(ready)
            p._record(batch, current)
            p._decode.handed_out = facts
            object.__setattr__(p, "_state", state)
            yield batch
    finally:
        stop.set()
        thread.join()
        object.__setattr__(p, "_iterating", False)
        object.__setattr__(p, "_state", None)
