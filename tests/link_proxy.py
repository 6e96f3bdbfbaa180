"""A remote store's link on one machine: a TCP proxy on 127.0.0.1 in front of a local endpoint (moto's S3 server)
that adds a first-byte latency to every request and caps the bandwidth of everything it sends back (one token
bucket shared by all connections, as one network link is). Used by the streaming tests and
``benchmarks/streaming.py``.

    proxy = LinkProxy("127.0.0.1", 5000, latency_s=0.02, bandwidth=100e6).start()
    ... endpoint_url=proxy.url ...
    proxy.stop()
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from typing import Any

CHUNK = 64 << 10


class LinkProxy:
    """Forward ``127.0.0.1:<port>`` to ``host:port``: each request waits ``latency_s`` before it is forwarded, and
    the bytes sent back leave at most at ``bandwidth`` bytes/s in all (``None``: no cap). ``bytes_down``: bytes
    sent back so far. While ``stall`` is set (bytes), requests that contain it are taken and never forwarded (a
    store that stops answering them: the connections stay open, nothing comes back); ``b""`` stalls every request."""

    def __init__(self, host: str, port: int, latency_s: float = 0.0, bandwidth: float | None = None,
                 counter: Any = None) -> None:  # fmt: skip
        self.host, self.upstream_port, self.latency_s, self.bandwidth = host, port, latency_s, bandwidth
        self.bytes_down, self.requests, self.port = 0, 0, 0
        self.stall: bytes | None = None
        self._counter = counter  # a multiprocessing.Value mirrored with bytes_down (the proxy in its own process)
        self._free_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LinkProxy:
        threading.Thread(target=self._run, name="link-proxy", daemon=True).start()
        if not self._ready.wait(10):
            raise RuntimeError("the link proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _run(self) -> None:
        self._loop = loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()
        server.close()  # stopped: open connections (a stalled request's too) are closed before the loop is
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.close()

    async def _pace(self, n: int) -> None:
        if not self.bandwidth:
            return
        now = time.monotonic()
        self._free_at = max(self._free_at, now) + n / self.bandwidth
        if self._free_at > now:
            await asyncio.sleep(self._free_at - now)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            client_w.close()
            return

        async def requests() -> None:
            while data := await client_r.read(CHUNK):
                self.requests += 1
                if self.stall is not None and self.stall in data:
                    await asyncio.sleep(3600)  # this connection's request is never forwarded
                if self.latency_s:
                    await asyncio.sleep(self.latency_s)
                up_w.write(data)
                await up_w.drain()
            up_w.close()

        async def responses() -> None:
            while data := await up_r.read(CHUNK):
                await self._pace(len(data))
                self.bytes_down += len(data)
                if self._counter is not None:
                    self._counter.value = self.bytes_down
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        try:
            await asyncio.gather(requests(), responses())
        except (ConnectionError, OSError):
            pass
        finally:
            for writer in (up_w, client_w):
                writer.close()


def _serve(host: str, port: int, latency_s: float, bandwidth: float | None, counter: Any, ports: Any) -> None:
    proxy = LinkProxy(host, port, latency_s, bandwidth, counter).start()
    ports.put(proxy.port)
    threading.Event().wait()  # until terminated


class LinkProxyProcess:
    """:class:`LinkProxy` in a process of its own, for a benchmark whose training process must not share its GIL
    with the link (an in-process proxy slows down while the training loop holds the GIL, and so would the store)."""

    def __init__(self, host: str, port: int, latency_s: float = 0.0, bandwidth: float | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._counter, ports = ctx.Value("q", 0, lock=False), ctx.Queue()
        self._process = ctx.Process(target=_serve, args=(host, port, latency_s, bandwidth, self._counter, ports),
                                    daemon=True)  # fmt: skip
        self._process.start()
        self.port = ports.get(timeout=60)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def bytes_down(self) -> int:
        return int(self._counter.value)

    def stop(self) -> None:
        self._process.terminate()
        self._process.join(10)
