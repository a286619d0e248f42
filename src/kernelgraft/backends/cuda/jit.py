"""CUDA C++ through NVRTC: the launch function returns ``kg.Launch``; kernelgraft compiles the
(config, template) variant once per arch (memory + disk cache) and launches it through
``kernelgraft.driver`` on the tensors' device and its current stream (modules load per device)."""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import torch

from .spec import CudaImpl, Launch
from ...errors import CompileError, LaunchError, describe
from .nvrtc import compile_cuda
from ...spec import Config, ImplSpec
from ...driver import load_module
from ...driver.params import kind_of, value_of
from ..device import on_tensor_device

__all__ = ["CudaBackend", "CudaRunner"]


@functools.cache
def capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


class CudaRunner:
    """``runner(*inputs, *outputs)``: one (spec, config), compiled lazily per template and arch."""

    def __init__(self, spec: CudaImpl, config: Config) -> None:
        self.spec = spec
        self.config = config
        self.kwargs = config.as_dict()
        self.label = f"cuda:{spec.display_name}[{config.label()}]"
        self._launchers: dict[Any, Any] = {}

    def __call__(self, *args: Any) -> None:
        launch = self.spec.launch(*args, **self.kwargs)  # type: ignore[misc]
        if type(launch) is not Launch:
            raise LaunchError(
                f"{self.label}: the launch function must return kg.Launch(grid, block, args), "
                f"got {describe(launch)}"
            )
        largs = launch.args
        kinds = tuple(kind_of(a, i) for i, a in enumerate(largs))
        device = next((a.device for a in largs if isinstance(a, torch.Tensor)), None)
        if device is None or device.type != "cuda":
            raise LaunchError(f"{self.label}: needs at least one CUDA tensor among the kernel arguments")
        index = device.index if device.index is not None else torch.cuda.current_device()
        template = launch.template
        key = (index, kinds, tuple(sorted(template.items())) if template else ())
        launcher = self._launchers.get(key)
        if launcher is None:
            launcher = self._launchers[key] = self._prepare(index, kinds, template)
        launcher(index, launch.grid, launch.block, [value_of(a) for a in largs], launch.shared_mem)

    def compile(self, arch: str, template=None, kind: str = "cubin"):
        spec = self.spec
        where = f"{self.label}{' ' + str(dict(template)) if template else ''}"
        return compile_cuda(
            spec.source, spec.expression(self.config, template),
            options=spec.compile_options(self.config, template), arch=arch, kind=kind,
            filename=f"{spec.display_name}.cu", where=where,
        )

    def _prepare(self, index: int, kinds, template):
        major, minor = capability(index)
        compiled = self.compile(f"sm_{major}{minor}", template)
        fn = load_module(compiled.image, compiled.kind, name=self.spec.display_name).function(compiled.symbol)
        fn.check_params(index, kinds)
        return fn.launcher(kinds)


class CudaBackend:
    name = "cuda"
    replayable = True  # its launches go through kernelgraft.driver, which notes them
    distributions = ("cuda-core", "cuda-python", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvrtc")

    @functools.cache
    def available(self) -> str | None:
        if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
            return "CUDA C++ kernels need cuda-bindings and NVRTC (pip install 'kernelgraft[cuda]')"
        return None

    def device_reason(self, device: torch.device) -> str | None:
        if device.type == "cuda":
            return None
        return f"CUDA C++ kernels run on CUDA tensors, got {device.type} tensors"

    def bind(self, spec: ImplSpec, config: Config):
        if not isinstance(spec, CudaImpl):
            raise CompileError(f"the cuda backend got a {type(spec).__name__}")
        # The driver launcher switches devices by itself; the wrapper also gives the user's launch
        # function the tensors' device as the current one (its own torch calls, streams).
        return on_tensor_device(CudaRunner(spec, config))

    def compile_ahead(self, spec: ImplSpec, config: Config, args, target) -> tuple:
        """The launch function's ``kg.Launch`` gives the template; the variant is compiled for the
        target's arch by the very ``CudaRunner.compile`` the launch uses, which writes
        kernelgraft's NVRTC disk cache (the launch misses it only when caching is off)."""
        launch = spec.launch(*args, **config.as_dict())  # type: ignore[misc]
        CudaRunner(spec, config).compile(target.arch, launch.template)  # type: ignore[arg-type]
        return ()
