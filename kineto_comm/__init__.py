"""kineto-comm: where communication costs distributed training time, from Kineto traces.

`analyze` and `Report` are imported on first use (PEP 562), not with the package: the
command line's first second (`--help`, `--version`, `rules`) then loads neither Polars nor
numpy. The submodule `kineto_comm.analyze` shares the function's name; as before, the
package's attribute is the function (the module is `sys.modules["kineto_comm.analyze"]`).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from kineto_comm.version import __version__

__all__ = ["Report", "__version__", "analyze"]
_LAZY = ("Report", "analyze")


class _Package(types.ModuleType):
    """This package: its `analyze` attribute stays the function once it is loaded, though
    the import system sets it to the submodule of that name when that is imported."""

    def __getattr__(self, name: str) -> Any:
        if name not in _LAZY:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from kineto_comm.analyze import Report, analyze

        self.__dict__.update(Report=Report, analyze=analyze)
        return self.__dict__[name]

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "analyze" and isinstance(value, types.ModuleType):
            return  # the submodule, just imported: the function keeps the name
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *_LAZY})


sys.modules[__name__].__class__ = _Package
