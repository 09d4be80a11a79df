"""kineto-comm: where communication costs distributed training time, from Kineto traces."""

__version__ = "0.1.0"

from kineto_comm.analyze import analyze  # noqa: E402
from kineto_comm.report import Report  # noqa: E402

__all__ = ["Report", "__version__", "analyze"]
