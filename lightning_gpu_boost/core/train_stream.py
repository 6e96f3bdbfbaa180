"""The training thread's CUDA stream while a GPU decode runs beside it (:class:`TrainStream`).

A training loop launches on its thread's current stream, by default CUDA's legacy default stream. Work on that
stream waits for all earlier work on every blocking stream of the process, and work there waits for it: a decoder
that launches on blocking streams beside the step (per-image copies and kernels) orders itself into the step's
kernels. On a stream of its own, created non-blocking as torch creates its streams, the step orders only with
what waits for it explicitly (the prefetcher's events).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ['TrainStream']


class TrainStream:
    """Run the training thread on a CUDA stream of its own between :meth:`enter` and :meth:`exit`.

    Framework-free: whoever runs the training loop calls :meth:`enter` in the training thread as training starts
    and :meth:`exit` in the same thread as it ends (``StreamPrefetch`` does it from ``on_train_start`` and its
    teardown, where a GPU decode feeds the training loader). :meth:`enter` orders the new stream after the work
    queued on the current one; :meth:`exit` orders the previous stream after the training's work and makes it
    current again. Both are idempotent; :meth:`exit` without :meth:`enter` does nothing.

    Args:
        device: the CUDA device the training runs on.
        priority: the stream's priority (lower is higher; torch maps values outside the device's range to its
            nearest end); 0: the default priority, that of the decoder's streams.

    Raises:
        ValueError: ``device`` not a CUDA device, or ``priority`` not an int.

    Example::

        >>> import torch
        >>> if torch.cuda.is_available():
        ...     stream = TrainStream(torch.device("cuda", 0))
        ...     stream.enter(); stream.exit()
        >>> TrainStream("cpu")
        Traceback (most recent call last):
        ...
        ValueError: device must be a CUDA device, got 'cpu'.
    """

    def __init__(self, device: torch.device | str, priority: int = 0) -> None:
        if not isinstance(device, (torch.device, str)) or torch.device(device).type != "cuda":
            raise ValueError(f"device must be a CUDA device, got {device!r}.")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be an int (lower is higher, 0 the default), got {priority!r}.")
        self.device, self.priority = torch.device(device), priority
        self.stream: torch.cuda.Stream | None = None
        self._previous: torch.cuda.Stream | None = None
        self.used = False  # entered at least once

    @property
    def entered(self) -> bool:
        return self.stream is not None

    def enter(self) -> None:
        if self.stream is not None:
            return
        previous = torch.cuda.current_stream(self.device)
        stream = torch.cuda.Stream(self.device, priority=self.priority)
        stream.wait_stream(previous)  # what was queued before training (the model's weights) comes first
        torch.cuda.set_stream(stream)
        self.stream, self._previous, self.used = stream, previous, True

    def exit(self) -> None:
        stream, previous, self.stream, self._previous = self.stream, self._previous, None, None
        if stream is None or previous is None:  # never entered (both are set together)
            return
        previous.wait_stream(stream)  # whatever runs after training sees its results
        torch.cuda.set_stream(previous)

    def figures(self) -> dict[str, Any]:
        """The stream's priority and whether training ran on it."""
        return {"priority": self.priority, "used": self.used}
