"""Shared bits of the benchmark scripts: environment facts, result files, host-cost timing."""

from __future__ import annotations

import datetime
import json
import os
import platform
import time
from pathlib import Path

# The benchmarks time tuned plans, so a new shape is tuned inside its first call (as warm-up
# scripts want) rather than off the caller's path; bench_first_call.py, which measures that path,
# sets the variable per process itself.
os.environ.setdefault("KERNELGRAFT_TUNE_BLOCKING", "1")


def environment() -> dict:
    import torch

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }
    if torch.cuda.is_available():
        info["capability"] = "sm_{}{}".format(*torch.cuda.get_device_capability())
        try:
            import subprocess

            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20,
            ).stdout.strip()
        except Exception:
            pass
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    import kernelgraft

    info["kernelgraft"] = kernelgraft.__version__
    return info


def write_json(name: str, payload: dict, out: str | None = None) -> Path:
    folder = Path(out or os.environ.get("OUT") or "benchmarks/results")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    return path


def add_llama_arguments(parser, batch: int = 4, seq: int = 1024) -> None:
    """The Llama of the graft benchmarks (hidden 2048, 4 layers: a Llama-class layer at a size one
    GPU times in seconds), as command-line options shared by the scripts that build it."""
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--seq", type=int, default=seq)


def build_llama(args):
    """The graft benchmarks' Llama (random weights, seed 0, bf16 on the GPU, eval mode) and a batch
    of token ids, from the options of ``add_llama_arguments``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
        max_position_embeddings=max(2048, args.seq),
    )
    model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    return model, torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")


def interleaved_host_us(variants: dict, args: tuple, calls: int, rounds: int) -> dict[str, list[float]]:
    """Host microseconds per call of each ``fn(*args)`` in ``variants``: ``rounds`` rounds of
    ``calls`` back-to-back calls each, the variants interleaved within a round so drift hits all
    alike. The GPU is idle at each round's start and drained after it: past the launch queue's
    depth (about a thousand launches) the host waits for the GPU, so a tiny kernel's GPU time per
    launch can set the pace (``covered_host_us`` measures the host alone)."""
    return _rounds(variants, args, calls, rounds, None)[0]


def covered_host_us(variants: dict, args: tuple, calls: int, rounds: int,
                    covered_us: float) -> tuple[dict[str, list[float]], int]:
    """Like ``interleaved_host_us``, with a spin kernel keeping the GPU busy for ``calls *
    covered_us`` microseconds before each round (``covered_us``: a generous bound on one call's
    host cost), so every timed launch only queues: the host's own cost. ``calls`` must stay under
    the launch queue's depth. Returns the samples and how many rounds were dropped because the
    spin ended before their last call."""
    if calls > 900:
        raise ValueError(f"covered_host_us: {calls} calls per round overrun the launch queue (about 1000)")
    return _rounds(variants, args, calls, rounds, covered_us)


def _rounds(variants: dict, args: tuple, calls: int, rounds: int,
            covered_us: float | None) -> tuple[dict[str, list[float]], int]:
    import torch

    from kernelgraft.timing.gpu_busy import cover

    samples: dict[str, list[float]] = {name: [] for name in variants}
    uncovered = 0
    for _ in range(rounds):
        for name, fn in variants.items():
            torch.cuda.synchronize()
            done = None
            if covered_us is not None:
                cover(calls * covered_us / 2, slack_us=200.0)
                done = torch.cuda.Event()
                done.record()
            start = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            elapsed = time.perf_counter() - start
            caught_up = done is not None and done.query()  # the GPU caught up: not the host alone
            torch.cuda.synchronize()
            if caught_up:
                uncovered += 1
                continue
            samples[name].append(elapsed / calls * 1e6)
    return samples, uncovered
