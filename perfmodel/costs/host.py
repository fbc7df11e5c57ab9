"""The host's costs around the kernels, read from a profile's ``host`` section as one typed record."""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.core.memo import IdentityMemo

DEFAULT_CPU_PER_KERNEL_S = 1.5e-5  # eager PyTorch, H200 host: add_tiny eager_sec (micro2.jsonl)


@dataclass(frozen=True)
class HostCosts:
    """Host costs as pricing applies them (perfmodel/fit/overhead.py fits them).

    ``serial``: a device without a launch queue (a CPU): each op's dispatch and compute follow
    each other. ``cpu_per_kernel_s``: CPU seconds to issue a kernel whose class has no measured
    floor. ``cpu_extra_per_kernel_s``: what module calls and autograd add around each kernel in a
    whole step. The rest apply on a serial host only (1 or 0 elsewhere):
    ``in_step_compute_factor`` scales each GEMM's compute (cold operands), ``side_by_side_factor``
    scales every kernel (the host's other training processes computing at once),
    ``step_extra_s`` is the step's own host work (zero_grad, optimizer bookkeeping) and
    ``ddp_bucket_extra_s`` a cost per DDP bucket. ``overlap_compute_slowdown``: the fraction by
    which compute slows while NCCL collectives run beside it (published, perfmodel/fit/published.py).
    """

    serial: bool = False
    cpu_per_kernel_s: float = DEFAULT_CPU_PER_KERNEL_S
    cpu_extra_per_kernel_s: float = 0.0
    in_step_compute_factor: float = 1.0
    side_by_side_factor: float = 1.0
    step_extra_s: float = 0.0
    ddp_bucket_extra_s: float = 0.0
    overlap_compute_slowdown: float = 0.0

    @classmethod
    def of(cls, profile) -> HostCosts:
        """The host costs of ``profile`` (a missing key takes the default above), read once per
        profile object (profiles are read-only)."""
        hit = _HOST.get(profile, cls)
        if hit is None:
            hit = cls._read(profile)
            _HOST.put(profile, cls, hit)
        return hit

    @classmethod
    def _read(cls, profile) -> HostCosts:
        h = profile.host
        serial = bool(h.get("serial"))
        side = float(h.get("side_by_side_factor", 1.0)) if serial else 1.0
        return cls(serial=serial, cpu_per_kernel_s=h.get("cpu_per_kernel_s", DEFAULT_CPU_PER_KERNEL_S),
                   cpu_extra_per_kernel_s=float(h.get("cpu_extra_per_kernel_s", 0.0)) * side,
                   in_step_compute_factor=float(h.get("in_step_compute_factor", 1.0)) if serial else 1.0,
                   side_by_side_factor=side,
                   step_extra_s=float(h.get("step_extra_s", 0.0)) if serial else 0.0,
                   ddp_bucket_extra_s=float(h.get("ddp_bucket_extra_s", 0.0)) if serial else 0.0,
                   # a serial host overlaps nothing (dp_backward_windows)
                   overlap_compute_slowdown=0.0 if serial else float(h.get("overlap_compute_slowdown", 0.0)))


_HOST = IdentityMemo(256)  # the host costs of a profile object (profiles are read-only)
