"""uvicorn serving an ASGI app in a thread of the test process, on a free port (real sockets, no engine)."""

from __future__ import annotations

import threading
from typing import Any

import uvicorn
from deploy.launcher import free_port_block, wait_until


class ThreadedServer:
    """``with ThreadedServer(app, http=protocol) as s:`` serves ``app`` on ``127.0.0.1:s.port``
    (``kwargs`` go to ``uvicorn.Config``) until the block ends."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        self.port = free_port_block(1)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off", **kwargs))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        wait_until(lambda: self.server.started, 30, "uvicorn", interval=0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
