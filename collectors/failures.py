"""One line per failure, once a minute per cause: how the collectors report what they could not do.

`describe_failure(exc)` names the cause in one line (the driver's error class and first message
line; never the SQL statement or its parameters). `FailureLog.error(key, cause, message)` logs
``message`` at ERROR when `key` (what failed) has a new cause or its cause was last logged over
`every_s` ago, and counts the rest, so a database locked for a minute is a few lines, not a
traceback per second.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError, SQLAlchemyError


def describe_failure(exc: BaseException) -> str:
    """One line naming the cause, without the statement or its parameters."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        text = str(exc.orig).strip()
        reason = text.splitlines()[0] if text else type(exc.orig).__name__
        return f"{type(exc.orig).__name__}: {reason}"[:300]
    text = str(exc).strip()
    if isinstance(exc, SQLAlchemyError):
        text = text.split("[SQL:", 1)[0].strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


class FailureLog:
    def __init__(self, logger: logging.Logger, clock: Callable[[], float], every_s: float = 60.0) -> None:
        self.logger = logger
        self.clock = clock
        self.every_s = every_s
        self.last: dict[str, tuple[str, float]] = {}
        self.suppressed = 0

    def error(self, key: str, cause: str, message: str, *args: object) -> bool:
        """Log `message % args` unless `key` logged the same `cause` within `every_s`; True if logged."""
        now = self.clock()
        previous = self.last.get(key)
        if previous is not None and previous[0] == cause and now - previous[1] < self.every_s:
            self.suppressed += 1
            return False
        self.last[key] = (cause, now)
        self.logger.error(message, *args)
        return True
