"""Data on object storage, through litdata (Lightning's streaming library): our boosts on its loaders, no streaming
engine of our own.

- :mod:`.source`: where a stream lives (``s3://bucket/prefix`` or a local folder): checked before training, with one
  clear error per problem (endpoint unreachable, no credentials, no such bucket or prefix, an interrupted upload),
  and the client settings litdata needs for an S3-compatible endpoint.
- :mod:`.images`: an image folder written as a litdata stream (our ``pack``'s checks, then litdata's ``optimize``)
  and its samples decoded into uint8 CHW tensors in the loader's workers.

Framework-free (no Lightning); ``litdata`` and ``boto3`` are the ``stream`` extra, imported on first use.
"""

from lightning_gpu_boost.core.streaming.images import DecodeImage, write_image_stream
from lightning_gpu_boost.core.streaming.source import StreamSource, StreamSourceError, check_stream_source

__all__ = ["DecodeImage", "StreamSource", "StreamSourceError", "check_stream_source", "write_image_stream"]
