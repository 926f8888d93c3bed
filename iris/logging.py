"""iris's logger: messages tagged with the rank that logged them, as Iris's ctx.info(...) prints.

iris.set_logger_level(iris.DEBUG) shows everything; the default shows warnings and errors.
Records carry `iris_rank` and `iris_num_ranks`, so a user's own formatter can use them too.
"""
import logging as _logging

DEBUG, INFO, WARNING, ERROR = _logging.DEBUG, _logging.INFO, _logging.WARNING, _logging.ERROR

logger = _logging.getLogger("iris")
if not logger.handlers:
    _handler = _logging.StreamHandler()
    _handler.setFormatter(_logging.Formatter("[iris rank %(iris_rank)s/%(iris_num_ranks)s] %(levelname)s: %(message)s",
                                             defaults={"iris_rank": "?", "iris_num_ranks": "?"}))
    logger.addHandler(_handler)
    logger.propagate = False
    logger.setLevel(WARNING)


class IrisFormatter(_logging.Formatter):
    """Iris's format, for handlers a program attaches itself: "[Iris] [rank/world] message", or
    "[Iris] message" for a record logged without a rank (through iris.logger directly)."""

    def format(self, record) -> str:
        rank = getattr(record, "iris_rank", None)
        tag = "[Iris]" if rank is None else f"[Iris] [{rank}/{getattr(record, 'iris_num_ranks', '?')}]"
        return f"{tag} {record.getMessage()}"


def set_logger_level(level) -> None:
    """Show iris's messages at `level` and above: iris.DEBUG, INFO, WARNING or ERROR (or a name)."""
    logger.setLevel(level.upper() if isinstance(level, str) else level)


def log(rank: int, world: int, level: int, message) -> None:
    """Log message at level, tagged with rank and world."""
    if logger.isEnabledFor(level):
        logger.log(level, message, extra={"iris_rank": rank, "iris_num_ranks": world})
