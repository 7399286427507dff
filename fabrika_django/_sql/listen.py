"""The listener's statements: subscribe to fabrika's channel, and a ping of a silent connection."""

from __future__ import annotations

from .._channel import CHANNEL


def listen() -> str:
    """Subscribe this session to the channel every kick's ``NOTIFY`` is sent on."""
    return f"LISTEN {CHANNEL}"


#: A round trip that tells a silent connection from a dead one.
PING = "SELECT 1"
