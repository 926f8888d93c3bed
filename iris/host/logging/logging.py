"""iris.host.logging.logging: the logger module's path in Iris (the same logger as iris.logger)."""
from ...logging import DEBUG, ERROR, INFO, WARNING, IrisFormatter, log, logger, set_logger_level

__all__ = ["DEBUG", "ERROR", "INFO", "WARNING", "IrisFormatter", "log", "logger", "set_logger_level"]
