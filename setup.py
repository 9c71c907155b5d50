"""The C halves of the flat codec (``schemas/_flat.c``) and of the partitioner
(``schemas/_murmur2.c``), the one part of the build that pyproject.toml cannot state without a
warning (its ``ext-modules`` table is experimental in setuptools). Everything else is in
pyproject.toml.

``optional``: without a C compiler or the Python headers the install still succeeds, and
``jobwheel.schemas.flat`` and ``jobwheel.schemas.partitioning`` use their Python instead
(``make test`` fails then, in ``tests/unit/test_flat_native.py`` and
``tests/unit/test_partitioning.py``, so a development setup does not lose them unnoticed).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("jobwheel.schemas._flat", ["schemas/_flat.c"], optional=True),
        Extension("jobwheel.schemas._murmur2", ["schemas/_murmur2.c"], optional=True),
    ],
)
