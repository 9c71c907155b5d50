"""The C half of the flat codec (``schemas/_flat.c``), the one part of the build that
pyproject.toml cannot state without a warning (its ``ext-modules`` table is experimental in
setuptools). Everything else is in pyproject.toml.

``optional``: without a C compiler or the Python headers the install still succeeds, and
``jobwheel.schemas.flat`` uses its generated Python instead (``make test`` fails then, in
``tests/unit/test_flat_codec.py``, so a development setup does not lose it unnoticed).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[Extension("jobwheel.schemas._flat", ["schemas/_flat.c"], optional=True)],
)
