"""kineto-comm: where communication costs distributed training time, from Kineto traces."""

__version__ = "0.1.0"
