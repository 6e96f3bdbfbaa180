"""Where a stream lives, checked before training: ``s3://bucket/prefix`` (AWS or any S3-compatible endpoint) or a
local folder holding litdata's ``index.json`` and chunk files.

:func:`check_stream_source` reads the index and lists the chunks the way litdata will, and turns each way this goes
wrong into one :class:`StreamSourceError` naming the URL and the fix: an endpoint that does not answer, no
credentials, a bucket or prefix that does not exist, an upload that stopped before its index or before every chunk
it lists. Without it these surface inside DataLoader workers, minutes later, as tracebacks from boto3 or a
``FileNotFoundError`` on a cache path.

:func:`litdata_storage_options` adds what litdata needs for an endpoint served over plain ``http://`` (an in-cluster
MinIO, a test server): litdata 0.2.x downloads chunks with obstore where it is installed, and builds obstore's
client without ``allow_http``, so every chunk GET of such an endpoint fails (``BadScheme``); for those endpoints the
chunks go through litdata's boto3 path instead (``LITDATA_ASYNC_CHUNK_PREFETCH=0`` in this process's environment,
litdata's own switch, and obstore marked unusable in litdata's downloader). HTTPS endpoints (AWS, GCS's S3 API,
most stores) are left to litdata's defaults.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

__all__ = ["ReapplyInWorker", "remote_stream", "StreamSource", "StreamSourceError", "check_stream_source", "litdata_storage_options"]

#: seconds to wait for an endpoint to answer before the check says it cannot be reached
CONNECT_TIMEOUT_S = 10


class StreamSourceError(RuntimeError):
    """A stream that cannot be read: the message names the URL, what is wrong and the fix."""


@dataclass(frozen=True)
class StreamSource:
    """A checked stream: its URL, the samples and chunks its index lists, the chunks' bytes, the samples in each
    chunk and each field's type (``{"image": "bytes", "label": "int", ...}``, litdata's ``types``)."""

    url: str
    samples: int
    chunks: list[str] = field(default_factory=list)
    chunk_bytes: int = 0
    chunk_samples: list[int] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def checksummed(self) -> bool:
        """Whether each sample carries the checksum :func:`~lightning_gpu_boost.core.streaming.write_image_stream`
        writes (older streams do not)."""
        return self.fields.get("crc") == "int"

    @property
    def remote(self) -> bool:
        return "://" in self.url


def _endpoint(storage_options: dict[str, Any] | None) -> str | None:
    options = storage_options or {}
    return options.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def litdata_storage_options(url: str, storage_options: dict[str, Any] | None,
                            read_timeout_s: float | None = None) -> dict[str, Any]:  # fmt: skip
    """``storage_options`` for litdata's ``StreamingDataset``; for an ``s3://`` URL on a plain-``http://`` endpoint,
    litdata is also told to download with boto3 in this process and the workers it forks (see the module's doc).
    ``read_timeout_s``: where litdata downloads with boto3 and ``storage_options`` hold no ``config``, a request
    that receives nothing for this long is retried (boto3's default waits 60 s; litdata's own wait for a chunk ends
    at 120 s, so a hung request would otherwise get one retry at most)."""
    options = dict(storage_options or {})
    endpoint = _endpoint(options)
    plain_http = urlparse(url).scheme == "s3" and bool(endpoint) and urlparse(str(endpoint)).scheme == "http"
    if read_timeout_s and urlparse(url).scheme == "s3" and "config" not in options and (plain_http or not _has_obstore()):
        from lightning_gpu_boost._imports import require

        options["config"] = require("botocore.config").Config(
            connect_timeout=min(CONNECT_TIMEOUT_S, read_timeout_s), read_timeout=read_timeout_s,
            retries={"max_attempts": 20, "mode": "standard"},
        )  # fmt: skip
    if plain_http:
        from lightning_gpu_boost._imports import require

        downloader = require("litdata.streaming.downloader")
        if hasattr(downloader, "_OBSTORE_INIT_PID"):  # obstore counts as unusable in a process that did not start it
            downloader._OBSTORE_INIT_PID = -1
        # litdata's batched chunk downloads (asyncio) take obstore without asking whether it is usable: off (its
        # documented switch), inherited by the workers; chunks are still downloaded ahead, one request each
        os.environ.setdefault("LITDATA_ASYNC_CHUNK_PREFETCH", "0")
    return options


def _has_obstore() -> bool:
    import importlib.util

    return importlib.util.find_spec("obstore") is not None


class ReapplyInWorker:
    """A DataLoader ``worker_init_fn`` that applies :func:`litdata_storage_options` again in each worker (a worker
    started by spawn or forkserver imports litdata afresh), then runs ``then(worker_id)`` where given."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None, then: Any = None) -> None:
        self.url, self.storage_options, self.then = url, dict(storage_options or {}), then

    def __call__(self, worker_id: int) -> None:
        litdata_storage_options(self.url, self.storage_options)
        if self.then is not None:
            self.then(worker_id)


def _s3_client(storage_options: dict[str, Any] | None) -> Any:
    from lightning_gpu_boost._imports import require

    boto3 = require("boto3")
    config = require("botocore.config").Config(
        connect_timeout=CONNECT_TIMEOUT_S, read_timeout=60, retries={"max_attempts": 2, "mode": "standard"}
    )
    options = {k: v for k, v in (storage_options or {}).items()
               if k in ("endpoint_url", "aws_access_key_id", "aws_secret_access_key", "aws_session_token",
                        "region_name", "verify")}  # fmt: skip
    return boto3.client("s3", config=config, **options)


def _list(client: Any, bucket: str, prefix: str) -> dict[str, int]:
    """Object names (relative to ``prefix``) and sizes under ``prefix``."""
    found, token = {}, None
    while True:
        kwargs = {"Bucket": bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
        page = client.list_objects_v2(**kwargs)
        for obj in page.get("Contents", []):
            found[obj["Key"][len(prefix) :]] = obj["Size"]
        if not page.get("IsTruncated"):
            return found
        token = page["NextContinuationToken"]


def _check_s3(url: str, storage_options: dict[str, Any] | None) -> tuple[dict, dict[str, int]]:
    from lightning_gpu_boost._imports import require

    exceptions = require("botocore.exceptions")
    parsed = urlparse(url)
    bucket, prefix = parsed.netloc, parsed.path.lstrip("/")
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    endpoint = _endpoint(storage_options) or "AWS's default endpoint"
    if not bucket:
        raise StreamSourceError(f"{url!r} names no bucket: write s3://BUCKET/PREFIX.")
    client = _s3_client(storage_options)
    try:
        objects = _list(client, bucket, prefix)
        index = json.loads(client.get_object(Bucket=bucket, Key=prefix + "index.json")["Body"].read()) if "index.json" in objects else None
    except exceptions.NoCredentialsError:
        raise StreamSourceError(
            f"No credentials to read {url!r}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or an AWS profile), "
            "or pass storage_options={'aws_access_key_id': ..., 'aws_secret_access_key': ...}."
        ) from None
    except (exceptions.EndpointConnectionError, exceptions.ConnectTimeoutError, exceptions.ReadTimeoutError) as err:
        raise StreamSourceError(
            f"Cannot reach {endpoint} to read {url!r}: {err}. Check the endpoint URL (storage_options "
            "'endpoint_url' or AWS_ENDPOINT_URL) and that this machine can reach it."
        ) from None
    except exceptions.ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        if code == "NoSuchBucket":
            raise StreamSourceError(f"Bucket {bucket!r} does not exist on {endpoint} ({url!r}).") from None
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
            raise StreamSourceError(
                f"{endpoint} refused to list {url!r} ({code}): check the credentials and the bucket's policy."
            ) from None
        raise StreamSourceError(f"Cannot read {url!r} on {endpoint}: {err}") from None
    if not objects:
        raise StreamSourceError(f"Nothing at {url!r} on {endpoint}: no object starts with {prefix!r}. Check the prefix.")
    if index is None:
        raise StreamSourceError(
            f"{url!r} has {len(objects)} object(s) but no index.json: an upload that stopped before its end (the "
            "index is uploaded last), or not a litdata stream. Upload it again (write_image_stream, or litdata's "
            "optimize)."
        )
    return index, objects


def _check_local(path: str) -> tuple[dict, dict[str, int]]:
    if not os.path.isdir(path):
        raise StreamSourceError(f"No folder at {path!r}: a local stream is a folder with index.json and chunk files.")
    objects = {name: os.path.getsize(os.path.join(path, name)) for name in os.listdir(path)
               if os.path.isfile(os.path.join(path, name))}  # fmt: skip
    if "index.json" not in objects:
        raise StreamSourceError(
            f"{path!r} holds no index.json: not a litdata stream, or one whose writing stopped before its end."
        )
    with open(os.path.join(path, "index.json")) as f:
        return json.load(f), objects


def _fields(url: str, config: dict[str, Any]) -> dict[str, str]:
    """The sample's fields and their types from an index's ``config``; refused where it is not an image stream."""
    types = config.get("types")
    if not isinstance(types, dict):  # litdata before ``types``: the field names are in the pytree spec
        try:
            context = json.loads(json.loads(config.get("data_spec") or "null")[1]["context"])
            types = dict(zip(context, config.get("data_format") or [], strict=False))
        except (TypeError, ValueError, KeyError, IndexError):
            types = {}
    if types.get("image") != "bytes" or types.get("label") != "int":
        shown = ", ".join(f"{k}: {v}" for k, v in types.items()) or "no named fields"
        raise StreamSourceError(
            f"{url!r} holds samples of another schema ({shown}); an image stream's samples hold 'image' (the file's "
            "bytes) and 'label' (an int). Write it with write_image_stream."
        )
    return {str(k): str(v) for k, v in types.items()}


def check_stream_source(url: str, storage_options: dict[str, Any] | None = None) -> StreamSource:
    """Check that ``url`` (``s3://bucket/prefix`` or a local folder) holds a complete litdata image stream: its
    index, every chunk the index lists at the size it lists, and samples holding an ``image`` (bytes) and a
    ``label`` (int). Raises :class:`StreamSourceError` (one line naming the URL and the fix) otherwise;
    ``ImportError`` naming the ``stream`` extra where boto3 is missing."""
    if not isinstance(url, str) or not url:
        raise StreamSourceError(f"A stream's URL must be a non-empty string, got {url!r}.")
    scheme = urlparse(url).scheme
    if scheme == "s3":
        index, objects = _check_s3(url, storage_options)
    elif scheme in ("", "file"):
        index, objects = _check_local(url[len("file://") :] if scheme == "file" else url)
    else:
        raise StreamSourceError(f"{url!r}: only s3:// URLs and local folders are checked here (got {scheme}://).")
    chunks = index.get("chunks") if isinstance(index, dict) else None
    if not isinstance(chunks, list) or not chunks:
        raise StreamSourceError(f"{url!r}: its index.json lists no chunks (not a litdata stream index).")
    compressed = bool((index.get("config") or {}).get("compression"))  # then chunk_bytes is not the file's size
    missing, short = [], []
    for chunk in chunks:
        name = chunk.get("filename")
        size = objects.get(name)
        if size is None:
            missing.append(name)
        elif not compressed and chunk.get("chunk_bytes") and size < int(chunk["chunk_bytes"]):
            short.append(f"{name} ({size} of {chunk['chunk_bytes']} bytes)")
    if missing or short:
        what = (f"{len(missing)} chunk(s) its index lists are missing ({', '.join(missing[:3])}"
                f"{', ...' if len(missing) > 3 else ''})" if missing else f"chunk(s) shorter than listed: {', '.join(short[:3])}")  # fmt: skip
        raise StreamSourceError(f"{url!r} is incomplete: {what}. An interrupted upload? Upload the stream again.")
    fields = _fields(url, index.get("config") or {})
    sizes = [int(c.get("chunk_size", 0)) for c in chunks]
    return StreamSource(url, sum(sizes), [c["filename"] for c in chunks],
                        sum(int(c.get("chunk_bytes", 0)) for c in chunks), sizes, fields)  # fmt: skip


def remote_stream(dataset: Any) -> dict[str, Any] | None:
    """``{"url", "max_pre_download", "cache_dir"}`` where ``dataset`` streams from object storage (litdata's
    ``StreamingDataset`` over an ``s3://``, ``gs://``, ``azure://``... URL, read by its attributes), else ``None``.
    ``cache_dir``: the local folder its chunks are downloaded into, where known."""
    source = getattr(dataset, "input_dir", None)
    url = getattr(source, "url", None) if source is not None and not isinstance(source, str) else source
    if not isinstance(url, str) or urlparse(url).scheme in ("", "file") or "://" not in url:
        return None
    return {"url": url, "max_pre_download": getattr(dataset, "max_pre_download", None),
            "cache_dir": _cache_folder(url, getattr(getattr(dataset, "cache_dir", None), "path", None))}  # fmt: skip


def _cache_folder(url: str, root: Any) -> str | None:
    """The folder litdata downloads ``url``'s chunks into: ``<cache root>/<md5 of the URL>`` (its layout), or the
    cache root where litdata's helpers are not found."""
    try:
        from litdata.utilities.dataset_utilities import generate_md5_hash, get_default_cache_dir
    except ImportError:
        return root if isinstance(root, str) else None
    return os.path.join(root if isinstance(root, str) else get_default_cache_dir(), generate_md5_hash(url))
