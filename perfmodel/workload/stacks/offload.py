"""Activation CPU offload: which stacks move a block's saved activations to host memory, and how.

``Strategy.offload_layers = k`` offloads the saved activations of the first k blocks:

* ``pytorch``: those blocks run inside ``torch.autograd.graph.save_on_cpu(pin_memory=True)``
  (torch 2.13 ``torch/autograd/graph.py``): the pack hook copies each saved tensor into pinned
  host memory (``packed.copy_(tensor, non_blocking=True)``) and the unpack hook copies it back
  (``tensor.to(device, non_blocking=True)``), both on the current stream, so the compute stream
  runs every copy in order: nothing overlaps ("serial"). Every saved tensor goes, autocast's
  16-bit weight casts included.
* ``megatron``: Megatron-Core ``--cpu-offloading-num-layers k`` (core_v0.16.0
  ``model_parallel_config.py``: ``cpu_offloading_activations=True``, ``cpu_offloading_weights=False``;
  ``transformer_block.py`` wraps each layer in Transformer Engine's offload context) runs TE's
  ``AsyncDoubleBufferGroupOffloadHandler`` (TransformerEngine v2.1
  ``transformer_engine/pytorch/cpu_offload.py``; ``cpu_offload_v1.py`` from v2.10): group i's
  copy runs on its own D2H stream while the layers up to ``layer_window_map[i]`` compute, the
  compute stream waits for it there, then frees the group and starts the next; backward reloads
  group i on an H2D stream from layer ``layer_window_map[i]`` down ("windowed"). Megatron refuses
  it with pipeline parallelism, with recomputation and for k >= the number of layers
  (``transformer_config.py``, ``__post_init__``).

Other stacks have no activation offload at the versions cited in ``STACKS``: torchtitan v0.2.2's
``training.enable_cpu_offload`` is FSDP2's ``CPUOffloadPolicy`` (parameters, gradients and optimizer
states, not activations).
"""

from __future__ import annotations

from perfmodel.core.errors import InvalidInputError, UnsupportedError

OFFLOAD_MODES = {"pytorch": "serial", "megatron": "windowed"}  # framework -> how the copies overlap compute
OFFLOAD_SOURCES = {
    "pytorch": "torch.autograd.graph.save_on_cpu(pin_memory=True) around the first k blocks (torch 2.13)",
    "megatron": "Megatron-Core core_v0.16.0 --cpu-offloading-num-layers k (Transformer Engine v2.1 cpu_offload.py)",
}


def check_offload(framework: str, offload_layers: int, *, pp: int, recompute: str) -> None:
    """Raise when ``offload_layers`` > 0 does not apply to the framework or its other options."""
    if not offload_layers:
        return
    if framework not in OFFLOAD_MODES:
        raise UnsupportedError(f"'offload_layers'={offload_layers} (activation CPU offload) does not apply to "
                               f"framework={framework!r}; stacks that take it: {', '.join(OFFLOAD_MODES)} "
                               f"({'; '.join(OFFLOAD_SOURCES.values())})")
    if pp > 1:
        raise UnsupportedError(f"'offload_layers'={offload_layers} is priced without pipeline parallelism "
                               f"(Megatron-Core refuses cpu_offloading with it): use pp=1 (got pp={pp})")
    if recompute != "none":
        raise UnsupportedError(f"'offload_layers'={offload_layers} with recompute={recompute!r}: Megatron-Core "
                               f"refuses cpu_offloading with recomputation, and it is priced only without: "
                               f"use recompute='none'")


def check_offload_layers(framework: str, offload_layers: int, layers: int) -> None:
    """Raise when more blocks are offloaded than the model has (Megatron: at least one stays)."""
    if not offload_layers:
        return
    most = layers - 1 if framework == "megatron" else layers
    if offload_layers > most:
        keep = " (Megatron-Core: cpu_offloading_num_layers < num_layers)" if framework == "megatron" else ""
        raise InvalidInputError(f"'offload_layers' must be at most {most} for a model of {layers} layers{keep}: "
                                f"got {offload_layers}")


def layer_windows(offload_layers: int, layers: int) -> list[int]:
    """Transformer Engine's ``layer_window_map``: the layer whose end group i's copy must reach.

    Copied from ``AsyncDoubleBufferGroupOffloadHandler.__init__`` (TE v2.1): the k groups spread
    over the L layers so the copies are balanced across the computation.
    """
    k, n = int(offload_layers), int(layers)
    windows, constant = [], 0
    for i in range(k):
        w = (n // k) * (i + 1) - 1
        if i < n % k:
            w += i + 1
            constant = i + 1
        else:
            w += constant
        windows.append(w)
    return windows


def overlap_layers(offload_layers: int, layers: int) -> list[int]:
    """Layers of compute each group's copy overlaps (the same count in forward and backward).

    Forward: group 0's copy starts after layer 0 and must end with layer ``window[0]``; group i's
    starts when group i−1's window closes. Backward: group i's reload starts before layer
    ``window[i]``'s backward and must land before layer ``window[i−1]``'s (layer 0's for group 0).
    Either way group i overlaps ``window[i] − window[i−1]`` layers (``window[−1]`` = 0).
    """
    windows = layer_windows(offload_layers, layers)
    return [w - (windows[i - 1] if i else 0) for i, w in enumerate(windows)]
