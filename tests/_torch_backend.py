"""A backend whose "kernels" are plain torch code on CPU tensors: thread safe and fast, for tests of
the dispatcher and the tuner that need real ops but no compiler (threads, scopes, planning).

``kg_torch(launch, configs)``: ``launch(*inputs, *outputs, **config)`` writes the outputs.
"""

from __future__ import annotations

import dataclasses

import torch

from kernelgraft.spec import Config, ImplSpec
from kernelgraft.backends import register


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class TorchImpl(ImplSpec):
    backend = "kgtest_torch"


class TorchBackend:
    name = "kgtest_torch"
    replayable = False

    def available(self) -> str | None:
        return None

    def device_reason(self, device: torch.device) -> str | None:
        return None if device.type == "cpu" else "torch test kernels run on CPU tensors"

    def bind(self, spec: TorchImpl, config: Config):
        launch, kwargs = spec.launch, config.as_dict()

        def run(*args):
            return launch(*args, **kwargs)

        return run


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class TorchCudaImpl(ImplSpec):
    backend = "kgtest_torch_cuda"


class TorchCudaBackend(TorchBackend):
    """The same on CUDA tensors (GPU tests of the tuner's timing)."""

    name = "kgtest_torch_cuda"

    def device_reason(self, device: torch.device) -> str | None:
        return None if device.type == "cuda" else "these torch test kernels run on CUDA tensors"


register(TorchBackend())
register(TorchCudaBackend())


def kg_torch(launch, configs=({},), **kw) -> TorchImpl:
    return TorchImpl(launch=launch, configs=configs, **kw)


def kg_torch_cuda(launch, configs=({},), **kw) -> TorchCudaImpl:
    return TorchCudaImpl(launch=launch, configs=configs, **kw)
