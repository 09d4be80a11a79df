"""The compiled scanner (kineto_comm/load/_scan.c) is optional: where it cannot be built,
the same tables come from the pure-Python decoder, only slower."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kineto_comm.load._scan",
            ["kineto_comm/load/_scan.c"],
            optional=True,
        )
    ]
)
