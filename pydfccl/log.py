"""Logging through the standard ``logging`` module, configured NCCL-style from the
environment: ``PYDFCCL_DEBUG=INFO`` (or DEBUG, WARNING, ...) sends pydfccl's records to
stderr with the process, thread and rank in each line. Applications that configure
``logging`` themselves need not set it: the records go to the ``pydfccl`` logger."""

import logging
import os

__all__ = ["logger", "configure_from_env"]

logger = logging.getLogger("pydfccl")


def configure_from_env() -> None:
    level = os.environ.get("PYDFCCL_DEBUG", "").strip().upper()
    if not level or logger.handlers:
        return
    if not isinstance(logging.getLevelName(level), int):
        raise ValueError(f"PYDFCCL_DEBUG={level!r} is not a logging level "
                         "(use DEBUG, INFO, WARNING or ERROR)")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(
        "%(asctime)s pydfccl %(process)d %(threadName)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
