"""A real S3-compatible endpoint for tests: moto's server mode (``ThreadedMotoServer``, as s3fs's own tests use it)
on 127.0.0.1, written and read over HTTP by the real clients (boto3, litdata)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@dataclass
class S3Server:
    endpoint: str

    @property
    def storage_options(self) -> dict[str, str]:
        return {"endpoint_url": self.endpoint, **CREDENTIALS}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", **CREDENTIALS)

    def bucket(self, name: str) -> str:
        client = self.client()
        if name not in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
            client.create_bucket(Bucket=name)
        return name


def free_port() -> int:
    from tests.ports import free_port as port

    return port()


@pytest.fixture(scope="session")
def s3_server():
    pytest.importorskip("moto.server", reason="moto[server] is a dev dependency (tools/make_venv.sh)")
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The session's server, with this process's AWS settings pointing nowhere else (no profile, no metadata
    service), and region set: boto3 in the tests and in litdata's workers reads the same."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    return s3_server
