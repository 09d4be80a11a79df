"""The compiled scanner (kineto_comm/load/_scan.c), the Flight Recorder dump reader
(kineto_comm/load/_frscan.c), the replay's sweep
(kineto_comm/analysis/_sweep.c) and the critical path's walk (kineto_comm/analysis/_walk.c)
are optional: where they cannot be built, the same tables, savings and paths come from
Python, only slower."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kineto_comm.load._scan",
            ["kineto_comm/load/_scan.c"],
            optional=True,
        ),
        Extension(
            "kineto_comm.load._frscan",
            ["kineto_comm/load/_frscan.c"],
            optional=True,
        ),
        Extension(
            "kineto_comm.analysis._sweep",
            ["kineto_comm/analysis/_sweep.c"],
            optional=True,
        ),
        Extension(
            "kineto_comm.analysis._walk",
            ["kineto_comm/analysis/_walk.c"],
            optional=True,
        ),
    ]
)
