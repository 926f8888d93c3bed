"""iris.host.logging: iris's rank-tagged logger (iris/logging.py) at Iris's module path."""
from ...logging import DEBUG, ERROR, INFO, WARNING, IrisFormatter, logger, set_logger_level

__all__ = ["DEBUG", "ERROR", "INFO", "WARNING", "IrisFormatter", "logger", "set_logger_level"]
