"""``kernelgraft check``: every candidate of an op against its reference.

>>> from kernelgraft.check import check_op
>>> from kernelgraft.examples.add_relu import add_relu
>>> report = check_op(add_relu, opcheck=False)   # doctest: +SKIP
>>> report.ok                                     # doctest: +SKIP
True
"""

from .api import check_op
from .harness import CheckOptions, CheckReport, Result, check_inputs, iter_check
from .isolate import check_in_process, check_isolated
from .progress import Events, Printer
from .report import render

__all__ = ["check_op", "check_inputs", "iter_check", "check_isolated", "check_in_process", "CheckOptions", "CheckReport",
           "Result", "Events", "Printer", "render"]
