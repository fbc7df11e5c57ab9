"""The configurations one call of ``step.evaluate`` prices, as one typed record of arrays.

``StepConfig`` holds the numeric strategy fields as numpy arrays that broadcast
together (one entry per configuration: ``predict`` passes 0-d values, ``search``
a million), and the fields every configuration priced together shares (the
software stack, an explicit pipeline split, the context- and expert-parallel
sizes) as plain values. It has no defaults of its own (``Strategy`` holds them); it is built
from a ``Strategy`` (:meth:`StepConfig.from_strategy`) or from a search space's
arrays over a base strategy (:meth:`StepConfig.from_space`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from enum import IntEnum

import numpy as np

from perfmodel.core.algebra import is_symbolic
from perfmodel.core.errors import PerfModelError
from perfmodel.parallel.zero_bubble import ZERO_BUBBLE
from perfmodel.workload.stacks import stack
from perfmodel.workload.stacks.float8 import float8_recipe

MIB = 2**20  # Strategy.bucket_mib is in MiB, as torch DDP bucket_cap_mb (bucket_cap_mb * 1024 * 1024)


def megatron_bucket_bytes(dp):
    """Megatron-Core's default gradient bucket: max(40,000,000, 1,000,000 · dp) elements of the fp32
    grad buffer when ``--ddp-bucket-size`` is unset (core_r0.9.0 distributed/distributed_data_parallel.py:
    larger buckets at large dp keep each ring chunk bandwidth-bound)."""
    return 4.0 * np.maximum(4e7, 1e6 * np.asarray(1 if dp is None else dp, float))


DDP_BUCKET_MIB = 25.0  # torch DDP bucket_cap_mb default (torch/nn/parallel/distributed.py)


def bucket_bytes(s, dp):
    """Bytes of one gradient bucket of ``Strategy`` ``s`` over ``dp`` ranks: ``bucket_mib`` MiB when
    given, else the framework's default: Megatron-Core's rule (``megatron_bucket_bytes``) for
    ``framework="megatron"``, torch DDP's 25 MiB for the others."""
    if s.bucket_mib is not None:
        return s.bucket_mib * MIB
    if s.framework == "megatron":
        return megatron_bucket_bytes(dp)
    return DDP_BUCKET_MIB * MIB


class Schedule(IntEnum):
    """Pipeline schedules (Narayanan et al. 2021, §2.2); ``Strategy.schedule`` names them."""

    ONE_F_ONE_B = 0
    GPIPE = 1
    INTERLEAVED = 2
    INTERLEAVED_ZB = 3  # torch.distributed.pipelining ScheduleInterleavedZeroBubble (parallel/zero_bubble.py)
    ZBV = 4             # torch.distributed.pipelining ScheduleZBVZeroBubble
    LOOPED_BFS = 5      # torch.distributed.pipelining ScheduleLoopedBFS (parallel/looped_bfs.py)
    DUALPIPEV = 6       # torch.distributed.pipelining ScheduleDualPipeV (parallel/zero_bubble.py)

    @classmethod
    def named(cls, name: str) -> Schedule:
        """The schedule ``Strategy.schedule`` calls ``name`` ("1f1b", "gpipe", "interleaved", "interleaved-zb", "zbv",
        "looped-bfs", "dualpipev")."""
        return {"1f1b": cls.ONE_F_ONE_B, "gpipe": cls.GPIPE, "interleaved": cls.INTERLEAVED,
                "interleaved-zb": cls.INTERLEAVED_ZB, "zbv": cls.ZBV, "looped-bfs": cls.LOOPED_BFS,
                "dualpipev": cls.DUALPIPEV}[name]


def _chunked(name: str) -> Schedule:
    """The schedule of a search row with virtual stages: a zero-bubble one where asked for, else interleaved."""
    return Schedule.named(name) if name in ZERO_BUBBLE else Schedule.INTERLEAVED


FLOAT_FIELDS = ("dp", "tp", "pp", "micro_batch", "micro_batches", "virtual_stages", "shard_stage",
                "ps_servers", "bucket_bytes", "schedule")
BOOL_FIELDS = ("sequence_parallel", "hybrid", "fsdp", "reshard", "tp_overlap", "dp_overlap")
SHARED_FIELDS = ("stage_layers", "framework", "attention", "cp", "ep", "compile", "loss", "tp_comm_overlap",
                 "offload_layers", "grad_reduce_fp32", "cp_comm", "ps_local_reduce", "optimizer_states", "fp8_params",
                 "memory_format", "norm_kernels", "float8_recipe", "expandable_segments", "grouped_experts", "etp")


def _frozen(value, dtype):
    """``value`` as a read-only array of ``dtype`` (a 0-d one as its numpy scalar); a sympy symbol
    (``perfmodel.analysis.symbolic`` leaves dp, micro_batch or micro_batches free) unchanged. An array
    already read-only of ``dtype``, over read-only memory (a field of another configuration, or a slice
    of one), is kept as it is: nothing can change it, so a copy would hold the same numbers."""
    if type(value) is np.ndarray and value.ndim and value.dtype == dtype and _read_only(value):
        return value
    if is_symbolic(value):
        return value
    arr = np.array(value, dtype=dtype)
    if arr.ndim == 0:
        return arr[()]
    arr.flags.writeable = False
    return arr


def _read_only(arr: np.ndarray) -> bool:
    """Whether ``arr`` and every array it views are read-only."""
    while isinstance(arr, np.ndarray):
        if arr.flags.writeable:
            return False
        arr = arr.base
    return True


@dataclass(frozen=True)
class StepConfig:
    """Strategy fields of the configurations priced together (arrays broadcast against each other).

    ``micro_batches``: micro-batches per step per data-parallel rank; ``shard_stage``: the
    ZeRO / FSDP sharding stage (0 none, 1 optimizer states, 2 + gradients, 3 + parameters);
    ``hybrid``: FSDP HYBRID_SHARD (shard inside a node); ``fsdp``: PyTorch FSDP rather than
    DeepSpeed ZeRO; ``reshard``: FSDP frees the gathered parameters after each unit (all but
    ``fsdp="shard-grad-op"``); ``bucket_bytes``: the DDP bucket; ``tp_overlap``: Megatron-LM
    asynchronous tensor-parallel communication in backward; ``dp_overlap``: the gradient
    reduction overlaps backward. Shared by every configuration: ``stage_layers`` (layers per
    pipeline stage, or None for the even split), ``framework``, ``attention``, ``cp``, ``ep``,
    ``compile`` (torch.compile), ``loss`` (eager, compiled, fused, chunked) and
    ``tp_comm_overlap`` ("" none, "userbuffers", "async") and ``offload_layers`` (blocks whose
    activations go to host memory; 0 when a caller builds a configuration without it).
    """

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    micro_batch: np.ndarray
    micro_batches: np.ndarray
    virtual_stages: np.ndarray
    shard_stage: np.ndarray
    sequence_parallel: np.ndarray
    ps_servers: np.ndarray
    bucket_bytes: np.ndarray
    hybrid: np.ndarray
    fsdp: np.ndarray
    reshard: np.ndarray
    schedule: np.ndarray
    tp_overlap: np.ndarray
    dp_overlap: np.ndarray
    stage_layers: tuple | None
    framework: str
    attention: str
    cp: int
    ep: int
    compile: bool
    loss: str
    tp_comm_overlap: str
    offload_layers: int = 0
    grad_reduce_fp32: bool | None = None  # main_grad (Megatron-Core) or FSDP reduce dtype fp32 (None: the framework's)
    cp_comm: str | None = None  # the context-parallel K/V exchange (None: the framework's; stacks/context.py)
    ps_local_reduce: bool = False  # a machine's GPUs sum their gradients before one push (Strategy)
    optimizer_states: str | None = None  # a Megatron-code optimizer's state layout (costs/memory.py OPTIMIZER_STATES)
    fp8_params: bool = False  # GEMM weights held as fp8 parameters (Strategy)
    memory_format: str = "channels_last"  # a CNN's activation layout (workload/stacks/layout.py)
    norm_kernels: str = "fused"  # the eager model code's RMSNorm (workload/stacks/norms.py)
    float8_recipe: str = ""  # the fp8 GEMMs' scaling recipe ("" without fp8; workload/stacks/float8.py)
    expandable_segments: bool | None = None  # PyTorch's allocator setting (None: the stack's launch; Strategy)
    grouped_experts: bool | None = None  # routed experts as grouped GEMMs (None: the stack's; stacks/experts.py)
    etp: int | None = None  # ranks each expert's linears split over (None: tp; Strategy.etp)

    def __post_init__(self):
        for name in FLOAT_FIELDS:
            object.__setattr__(self, name, _frozen(getattr(self, name), float))
        for name in BOOL_FIELDS:
            object.__setattr__(self, name, _frozen(getattr(self, name), bool))
        if self.stage_layers is not None:
            object.__setattr__(self, "stage_layers", tuple(self.stage_layers))
        object.__setattr__(self, "cp", int(self.cp))
        object.__setattr__(self, "ep", int(self.ep))
        object.__setattr__(self, "etp", None if self.etp is None else int(self.etp))
        object.__setattr__(self, "compile", bool(self.compile))
        object.__setattr__(self, "tp_comm_overlap", self.tp_comm_overlap or "")
        object.__setattr__(self, "offload_layers", int(self.offload_layers))

    @property
    def expert_tp(self):
        """Ranks each expert's linears split over: ``etp``, or tp where unset (Megatron-Core's default)."""
        return np.asarray(self.tp, float) if self.etp is None else np.asarray(self.etp, float)

    @property
    def expert_fold(self):
        """tp / etp: how many times more ranks share a stage's experts than tp alone (1 where etp is unset)."""
        return 1.0 if self.etp is None else np.asarray(self.tp, float) / self.expert_tp

    @classmethod
    def from_strategy(cls, s) -> StepConfig:
        """The configuration of one ``Strategy`` (0-d values)."""
        return cls(dp=s.dp, tp=s.tp, pp=s.pp, micro_batch=s.micro_batch, micro_batches=s.micro_batches,
                   virtual_stages=s.virtual_stages, shard_stage=s.shard, sequence_parallel=s.sequence_parallel,
                   ps_servers=s.ps_servers, bucket_bytes=bucket_bytes(s, s.dp), hybrid=s.fsdp == "hybrid",
                   fsdp=s.fsdp is not None, reshard=s.fsdp != "shard-grad-op", schedule=float(Schedule.named(s.schedule)), tp_overlap=s.tp_overlap,
                   dp_overlap=s.dp_overlap, stage_layers=s.stage_layers, framework=s.framework,
                   attention=s.attention, cp=s.cp, ep=s.ep, compile=s.compile, loss=s.loss,
                   tp_comm_overlap=s.tp_comm_overlap or "", offload_layers=s.offload_layers,
                   grad_reduce_fp32=s.grad_reduce_fp32, cp_comm=s.cp_comm, ps_local_reduce=s.ps_local_reduce,
                   optimizer_states=s.optimizer_states, fp8_params=s.fp8_params,
                   memory_format=s.memory_format, norm_kernels=s.norm_kernels,
                   float8_recipe=float8_recipe(stack(s.framework).float8, s.float8_recipe, s.framework, s.precision),
                   expandable_segments=s.expandable_segments, grouped_experts=s.grouped_experts, etp=s.etp)

    @classmethod
    def from_space(cls, arrays: Mapping, base) -> StepConfig:
        """A search space's configurations (``explore.space.Space.arrays``: dp, tp, pp,
        virtual_stages, micro_batch, micro_batches, zero, fsdp, sequence_parallel, tp_overlap,
        one entry each) over the fields of ``base`` (a ``Strategy``) that search does not vary.
        More than one virtual stage means ``base``'s chunked schedule (the interleaved one unless it names a
        zero-bubble one), otherwise 1F1B."""
        v = np.asarray(arrays["virtual_stages"], float)
        fsdp = np.asarray(arrays["fsdp"], object)
        return replace(cls.from_strategy(base), dp=arrays["dp"], tp=arrays["tp"], pp=arrays["pp"],
                       micro_batch=arrays["micro_batch"], micro_batches=arrays["micro_batches"], virtual_stages=v,
                       shard_stage=arrays["zero"], sequence_parallel=arrays["sequence_parallel"],
                       tp_overlap=arrays["tp_overlap"], fsdp=np.not_equal(fsdp, None),
                       hybrid=np.equal(fsdp, "hybrid"), bucket_bytes=bucket_bytes(base, arrays["dp"]),
                       schedule=np.where(v > 1, float(_chunked(base.schedule)), float(Schedule.ONE_F_ONE_B)))

    def rows(self, lo: int, hi: int) -> StepConfig:
        """Configurations ``lo`` to ``hi`` of these (the arrays of one entry per configuration sliced)."""
        n = max(np.size(getattr(self, f)) for f in (*FLOAT_FIELDS, *BOOL_FIELDS))
        return replace(self, **{f: getattr(self, f)[lo:hi] for f in (*FLOAT_FIELDS, *BOOL_FIELDS)
                                if np.ndim(getattr(self, f)) and np.size(getattr(self, f)) == n})

    @classmethod
    def stack(cls, configs: Sequence[StepConfig]) -> StepConfig:
        """Configurations side by side (one entry each); they must share the shared fields."""
        for name in SHARED_FIELDS:
            values = {repr(getattr(c, name)) for c in configs}
            if len(values) != 1:
                raise PerfModelError(f"configurations priced together must share {name!r}: got {sorted(values)}")
        arrays = {f.name: np.array([getattr(c, f.name) for c in configs])
                  for f in fields(cls) if f.name not in SHARED_FIELDS}
        return replace(configs[0], **arrays)
