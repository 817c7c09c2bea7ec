"""A TCP forwarder a test can open and close, to make a real worker reachable or not on another port.

Not a fake worker: bytes go both ways unchanged to the real one. ``close()`` also drops the
connections it carries, so the port behaves like a worker that went away.
"""

from __future__ import annotations

import asyncio
import threading


class TcpProxy:
    """``127.0.0.1:port`` -> ``127.0.0.1:target``, served from a thread of its own."""

    def __init__(self, port: int, target: int) -> None:
        self.port, self.target = port, target
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            target_r, target_w = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            client_w.close()
            return
        self._writers |= {client_w, target_w}
        await asyncio.gather(self._pipe(client_r, target_w), self._pipe(target_r, client_w))
        self._writers -= {client_w, target_w}

    def open(self) -> TcpProxy:
        async def start() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

        asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        return self

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                self._server = None
            for w in list(self._writers):
                w.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)

    def shutdown(self) -> None:
        self.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
