"""Free TCP ports on 127.0.0.1 for tests that need several consecutive ones (a fleet: router, replicas, metrics)."""

from __future__ import annotations

import socket


def free_block(n: int) -> int:
    """A port p with p … p+n-1 all free now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n > 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {n} consecutive free ports")
