"""Addresses for rendezvous: the node's IP as Ray sees it, and a free TCP port on it."""

from __future__ import annotations

import socket


def free_port(host: str = "") -> int:
    """A port that was free a moment ago on ``host`` ("": every interface, for peers on other
    nodes); the caller retries on a lost race."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def node_ip() -> str:
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # not under Ray
        return "127.0.0.1"
