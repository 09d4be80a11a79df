"""kineto-comm: where communication costs distributed training time, from Kineto traces."""

from kineto_comm.analyze import Report, analyze
from kineto_comm.version import __version__

__all__ = ["Report", "__version__", "analyze"]
