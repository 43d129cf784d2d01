"""`get_logger`: a logger that, by default, speaks on the main process only (Accelerate's ``accelerate.logging``)."""

from __future__ import annotations

import logging
import os
from typing import Any


class MultiProcessAdapter(logging.LoggerAdapter):
    """Pass ``main_process_only=False`` to log on every process, ``in_order=True`` to log rank by rank."""

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        main_process_only = kwargs.pop("main_process_only", True)
        kwargs.pop("in_order", None)
        if not self.isEnabledFor(level):
            return
        if main_process_only and int(os.environ.get("RANK", "0")) != 0:
            return
        msg, processed = self.process(msg, kwargs)
        self.logger.log(level, msg, *args, **processed)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """A logger for `name`; level from `log_level` or ``TRAINWRIGHT_LOG_LEVEL``."""
    logger = logging.getLogger(name)
    level = log_level or os.environ.get("TRAINWRIGHT_LOG_LEVEL")
    if level is not None:
        logger.setLevel(level.upper())
        logger.root.setLevel(level.upper())
    return MultiProcessAdapter(logger, {})
