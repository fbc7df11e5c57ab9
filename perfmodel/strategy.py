"""Parallel strategy: how a step is split over GPUs, as validated data.

Fields follow the contract in the design notes. ``zero`` is the ZeRO stage
(Rajbhandari et al. 2020; 3 is what PyTorch FSDP's FULL_SHARD does);
``fsdp="hybrid"`` shards within a node and replicates across nodes (FSDP
HYBRID_SHARD). ``ps_servers`` > 0 trains with parameter servers instead of
all-reduce. ``placement`` orders the groups from fastest-varying rank up:
the default puts tensor groups inside a node first, then pipeline, then data.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from perfmodel.errors import InvalidInputError
from perfmodel.validation import check_choice, check_int, check_positive
from perfmodel.workload.step import PRECISIONS, RECOMPUTE

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("1f1b", "gpipe", "interleaved")
PLACEMENTS = ("tp-pp-dp", "tp-dp-pp", "pp-tp-dp", "dp-tp-pp")
FSDP = (None, "full", "hybrid")


@dataclass(frozen=True)
class Strategy:
    """How one training step is parallelised; all sizes are per step unless named otherwise."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 8
    global_batch: int | None = None     # None: dp × micro_batch (no gradient accumulation)
    zero: int = 0
    recompute: str = "none"
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    schedule: str = "1f1b"
    virtual_stages: int = 1
    sequence_parallel: bool = False
    fsdp: str | None = None
    bucket_mb: float = 25.0             # torch DDP bucket_cap_mb default
    ps_servers: int = 0
    placement: str = "tp-pp-dp"
    stage_layers: tuple | None = None   # uneven pipeline split: layers per stage

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "micro_batch", "virtual_stages"):
            object.__setattr__(self, name, check_int(name, getattr(self, name)))
        if self.global_batch is not None:
            object.__setattr__(self, "global_batch", check_int("global_batch", self.global_batch))
        object.__setattr__(self, "zero", check_int("zero", self.zero, minimum=0))
        if self.zero > 3:
            raise InvalidInputError(f"'zero' must be 0, 1, 2 or 3: got {self.zero}")
        object.__setattr__(self, "ps_servers", check_int("ps_servers", self.ps_servers, minimum=0))
        check_positive("bucket_mb", self.bucket_mb)
        check_choice("recompute", self.recompute, RECOMPUTE)
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("placement", self.placement, PLACEMENTS)
        check_choice("fsdp", self.fsdp, FSDP)
        if not isinstance(self.sequence_parallel, bool):
            raise InvalidInputError(f"'sequence_parallel' must be True or False: got {self.sequence_parallel!r}")
        self._check_combinations()

    def _check_combinations(self):
        if self.ps_servers and (self.zero or self.fsdp):
            raise InvalidInputError("a parameter server ('ps_servers' > 0) cannot be combined with 'zero' "
                                    f"or 'fsdp' sharding: got zero={self.zero}, fsdp={self.fsdp!r} (use zero=0, fsdp=None)")
        if self.ps_servers and (self.tp > 1 or self.pp > 1):
            raise InvalidInputError("parameter-server training here is data parallel only: use tp=1, pp=1 "
                                    f"with 'ps_servers' (got tp={self.tp}, pp={self.pp})")
        if self.fsdp and self.zero not in (0, 3):
            raise InvalidInputError(f"'fsdp' already implies full sharding; 'zero' must be 0 or 3 with it: got {self.zero}")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise InvalidInputError(f"'virtual_stages'={self.virtual_stages} needs schedule='interleaved' (got {self.schedule!r})")
        if self.sequence_parallel and self.tp == 1:
            raise InvalidInputError("'sequence_parallel' needs tp > 1 (it splits norms across the tensor group)")
        if self.global_batch is not None and self.global_batch % (self.dp * self.micro_batch):
            g = self.dp * self.micro_batch
            lo = max(g, self.global_batch // g * g)
            raise InvalidInputError(f"'global_batch'={self.global_batch} must be a multiple of dp × micro_batch = {g} "
                                    f"(nearby: {lo} or {lo + g})")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def shard(self) -> int:
        """ZeRO stage in force (fsdp counts as stage 3)."""
        return 3 if self.fsdp else self.zero

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step per data-parallel rank (gradient accumulation × pipeline)."""
        gb = self.global_batch or self.dp * self.micro_batch
        return gb // (self.dp * self.micro_batch)

    @property
    def batch(self) -> int:
        return self.global_batch or self.dp * self.micro_batch

    def replace(self, **changes) -> Strategy:
        return replace(self, **changes)

    def __repr__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default or f.name in ("dp", "tp", "pp", "micro_batch"):
                parts.append(f"{f.name}={value!r}")
        return "Strategy(" + ", ".join(parts) + ")"
