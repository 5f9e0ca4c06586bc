"""Device strings as TensorFlow spells them in many ways, made comparable."""

from __future__ import annotations


def normalize_device(device: str) -> str:
    """'/job:localhost/replica:0/task:0/device:CPU:0', '/cpu:0' -> '/device:CPU:0'."""
    if not device:
        return ""
    tail = device.rsplit("/", 1)[-1]
    if tail.lower().startswith("device:"):
        tail = tail[len("device:"):]
    kind, _, number = tail.partition(":")
    return f"/device:{kind.upper()}:{number or '0'}"
