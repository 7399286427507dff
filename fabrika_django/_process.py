"""What a worker process sets up around its loop: the log level from ``--verbosity``, and stop signals."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

logger = logging.getLogger("fabrika_django.worker")

# Django's verbosity: 0 warnings only, 1 one line per run start and end, 2 and more debug.
_LEVELS = {0: logging.WARNING, 1: logging.INFO}


def configure_logging(verbosity: int | None) -> None:
    """Set the level of fabrika's loggers from a Django ``--verbosity`` (None: leave the project's logging)."""
    if verbosity is None:
        return
    package = logging.getLogger("fabrika_django")
    package.setLevel(_LEVELS.get(verbosity, logging.DEBUG))
    if not package.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        package.addHandler(handler)


@contextmanager
def stop_signals(
    stop: Callable[[], None],
    *,
    install: bool = True,
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> Iterator[None]:
    """Call ``stop`` on SIGTERM or SIGINT (or ``signals``) during the block (main thread only), then restore."""
    if not install or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.info("Stopping signal=%s", signal.Signals(signum).name)
        stop()

    previous = {signum: signal.signal(signum, on_signal) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
