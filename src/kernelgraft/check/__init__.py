"""``kernelgraft check``: every candidate of an op against its reference.

>>> from kernelgraft.check import check_op
>>> from kernelgraft.examples.add_relu import add_relu
>>> report = check_op(add_relu, opcheck=False)   # doctest: +SKIP
>>> report.ok                                     # doctest: +SKIP
True
"""

from ._harness import CheckReport, Result, check_op
from ._report import render

__all__ = ["check_op", "CheckReport", "Result", "render"]
