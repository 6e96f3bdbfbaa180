"""GPU decode: the workers send JPEG bytes with each sample's drawn parameters, the GPU decodes, crops, resizes,
flips and normalizes (``StreamPrefetch(decode=...)``, ``GPUBoost``'s default ``decode="auto"``).

- :mod:`.plan`: which pipelines are taken over, and the workers' side;
- :mod:`.records`: a sample and a batch on their way from the workers (collated in shared memory);
- :mod:`.decode`: the GPU's side (:class:`BatchDecoder`);
- :mod:`.dali_windows`: the crop windows decoded by DALI's pipelines, off the training thread's GIL;
- :mod:`.engines`: the GPU's JPEG engines through nvImageCodec;
- :mod:`.placement`: where to decode, by measurement (:class:`SplitSearch`), and on what (:class:`DecoderChoice`).
"""

from lightning_gpu_boost.core.gpu_decode.decode import BatchDecoder, is_records
from lightning_gpu_boost.core.gpu_decode.placement import Decision, DecoderChoice, SplitSearch, agreed
from lightning_gpu_boost.core.gpu_decode.plan import (
           DecodePlan,
           EncodedTransform,
           Share,
           give_back,
           recognize,
           split_worker_cpus,
           take_over,
)
from lightning_gpu_boost.core.gpu_decode.records import Record, RecordBatch, collate_records

__all__ = ["BatchDecoder", "Decision", "DecodePlan", "DecoderChoice", "EncodedTransform", "Record", "RecordBatch", "Share",
           "SplitSearch", "agreed", "collate_records", "give_back", "is_records", "recognize", "split_worker_cpus",
           "take_over"]  # fmt: skip
