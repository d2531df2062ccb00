"""What a memory plan is made of: the hardware it is checked against (`Hardware`), one phase's
terms per device and per host (`Phase`), the plan (`Plan`: its phases, what fits), and the batch
as the trainer splits it (`Workload`, from the spec by `workload`). No torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from gspo_cli.plan import fit
from gspo_cli.plan.micro import forward_rows
from gspo_cli.plan.shapes import DTYPE_BYTES, ModelShape
from gspo_cli.spec import ExperimentSpec


@dataclass(frozen=True)
class Hardware:
    gpus_per_node: int = 1
    nodes: int = 1
    gpu_bytes: int | None = None  # None: no verdict for the device
    host_bytes: int | None = None  # None: no verdict for the host

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes


# Names of the fixed allowances a phase carries (not derived from the spec, not transient).
RUNTIME_TERMS = ("CUDA", "CPU", "runtime", "libraries")


@dataclass
class Phase:
    """One phase's terms: (name, bytes) on each device (the busiest rank) and on each host
    (the busiest node, rank 0's)."""

    name: str
    device: list[tuple[str, int]] = field(default_factory=list)
    host: list[tuple[str, int]] = field(default_factory=list)

    @property
    def device_total(self) -> int:
        return sum(b for _, b in self.device)

    @property
    def host_total(self) -> int:
        return sum(b for _, b in self.host)

    resident: frozenset[str] = frozenset()  # names of the terms every phase keeps (weights, AdamW...)

    def transient_terms(self, where: str = "device") -> list[tuple[str, int]]:
        """What this phase adds over the state every phase keeps and the fixed runtime allowances
        (the terms a spec change can shrink)."""
        terms = self.device if where == "device" else self.host
        return [t for t in terms if t[0] not in self.resident and not t[0].startswith(RUNTIME_TERMS)]

    def dominant(self, where: str = "device", transient: bool = False) -> str:
        """The largest term's name; `transient`: the largest of `transient_terms`."""
        terms = self.transient_terms(where) if transient else (self.device if where == "device" else self.host)
        return max(terms, key=lambda t: t[1])[0] if terms else "-"


@dataclass
class Plan:
    layout: str
    params: int
    world: int
    device_kind: str  # "cuda" or "cpu" (cpu: the device is the host; per-device = per process)
    phases: list[Phase]
    hardware: Hardware
    notes: list[str] = field(default_factory=list)

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)

    def fits(self, phase: Phase) -> tuple[bool | None, bool | None]:
        """(device fits, host fits); None where no capacity was given."""
        hw = self.hardware
        dev = None if hw.gpu_bytes is None else phase.device_total <= hw.gpu_bytes
        host = None if hw.host_bytes is None else phase.host_total <= hw.host_bytes
        return dev, host

    def problems(self, remedies: dict[str, str] | None = None) -> list[str]:
        """One line per phase that does not fit, naming its largest term (plan/fit.py)."""
        return fit.problems(self, remedies)


@dataclass(frozen=True)
class Workload:
    """The spec's batch, read the way the trainer splits it."""

    rows: int  # rollout rows per rank (whole groups)
    update_rows: int  # rows per rank in one forward and backward of the update (a micro-batch's)
    forward_rows: int  # rows per rank in one no-grad forward (pi_old, the reference; micro-batches)
    sample_rows: int  # rows per rank sampled at once (rollout.sample_rows)
    prompt_tokens: int
    new_tokens: int
    compute_bytes: int  # model.dtype
    checkpointing: bool
    kl: bool
    routes: bool  # an MoE whose routes pi_old records (every arm does, for volatility)

    @property
    def tokens(self) -> int:  # T: prompt + response, responses at full length (the worst case)
        return self.prompt_tokens + self.new_tokens


def workload(spec: ExperimentSpec, shape: ModelShape, world: int, prompt_tokens: int) -> Workload:
    rows = max(1, spec.rollout.batch_size // world)
    fewest = min(a.mini_batches for a in spec.arms)  # the arm with the largest mini-batch
    micro = forward_rows(spec, prompt_tokens + spec.rollout.max_new_tokens) or rows  # plan/micro.py
    return Workload(
        rows=rows,
        update_rows=min(micro, max(1, rows // fewest)),
        forward_rows=min(micro, rows),
        sample_rows=min(spec.rollout.sample_rows or rows, rows),
        prompt_tokens=prompt_tokens,
        new_tokens=spec.rollout.max_new_tokens,
        compute_bytes=DTYPE_BYTES[spec.model.dtype],
        checkpointing=spec.train.gradient_checkpointing,
        kl=any(a.kl_coef > 0 for a in spec.arms),
        routes=shape.experts > 0,
    )
