"""NVIDIA DALI pipelines with exact epochs, framework-free: :mod:`.sources` (what is read, by whom), :mod:`.graphs` (the
DALI operators) and :mod:`.loader` (:class:`DALILoader`). DALI itself is imported when a pipeline is built (extra
``dali``, or ``dali-cuda13``)."""

from lightning_gpu_boost.core.dali.graphs import audio_graph, classification_graph
from lightning_gpu_boost.core.dali.loader import DALILoader, close_all
from lightning_gpu_boost.core.dali.sources import (
    DTYPES,
    Dtype,
    FileListSource,
    FolderSource,
    PackSource,
    num_batches,
    open_source,
    rank_indices,
)

__all__ = ["DTYPES", "DALILoader", "Dtype", "FileListSource", "FolderSource", "PackSource", "audio_graph",
           "classification_graph", "close_all", "num_batches", "open_source", "rank_indices"]  # fmt: skip
