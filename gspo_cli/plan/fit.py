"""Which phases of a plan do not fit, one line each: the phase, its total against the capacity
(per GPU or per process, as the table's column says; per host), its largest single term and
size, and, where the spec has one, the field that shrinks that phase."""

from __future__ import annotations

from gspo_cli.plan.units import gb

HOST_SHARE = "device memory of "  # a CPU run's host term: its processes' per-process figures, summed


def unit(device_kind: str) -> str:
    """What the table's per-device column is: a GPU, or (model.device cpu) a process."""
    return "GPU" if device_kind == "cuda" else "process"


def largest_term(phase, where: str = "device") -> tuple[str, int]:
    """(name, bytes) of the largest single term of `phase`'s per-device or per-host total. A CPU
    run's host total holds its processes' per-process figures as one sum: read as their terms,
    each times the processes on the host (named so)."""
    terms = list(phase.device if where == "device" else phase.host)
    for name, b in list(terms):
        if where == "host" and name.startswith(HOST_SHARE) and phase.device_total:
            procs = round(b / phase.device_total)
            terms.remove((name, b))
            terms += [(f"{n}{f' (x {procs} processes)' if procs > 1 else ''}", procs * v) for n, v in phase.device]
    return max(terms, key=lambda t: t[1]) if terms else ("-", 0)


def problems(plan, remedies: dict[str, str] | None = None) -> list[str]:
    """One line per phase and capacity it exceeds, naming its largest term; `remedies`: per phase
    name, the spec field that shrinks the phase's own memory (said on per-GPU/process lines, and
    on per-host lines of a CPU run, whose host holds the processes' memory)."""
    out, remedies = [], remedies or {}
    hw = plan.hardware
    for p in plan.phases:
        dev_ok, host_ok = plan.fits(p)
        for ok, where, total, cap in (
            (dev_ok, "device", p.device_total, hw.gpu_bytes),
            (host_ok, "host", p.host_total, hw.host_bytes),
        ):
            if ok is not False:
                continue
            name, size = largest_term(p, where)
            per = f"per {unit(plan.device_kind) if where == 'device' else 'host'}"
            fix = remedies.get(p.name) if where == "device" or plan.device_kind == "cpu" else None
            out.append(
                f"{p.name}: {gb(total)} {per} exceeds {gb(cap)} (largest term: {name}, {gb(size)})"
                + (f"; {fix}" if fix else "")
            )
    return out
