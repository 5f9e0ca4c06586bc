"""The package is described in pyproject.toml; this file only adds the optional C
extension (graphmem/_native.c). Without a C compiler the install still succeeds and
graphmem runs the same loops in Python (graphmem/native.py)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("graphmem._native", ["graphmem/_native.c"], optional=True,
                             extra_compile_args=["-O2"])])
