"""How much of the policy trains, as run.json's `params` record says it (readable without torch:
`gspo compare` shows it): {"trainable", "total", "lora": {r, alpha, targets, experts, routers,
base_dtype} or absent for full fine-tuning}."""

from __future__ import annotations


def count_text(n: int) -> str:
    """12345 -> '12.3 k', 1234567 -> '1.23 M' (three significant digits)."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return str(n)


def param_line(info: dict) -> str:
    """'trains 24.6 k of 1.23 M parameters (2.0%): LoRA r=8 alpha=16 on all-linear, experts frozen,
    routers frozen; the base frozen in float32' (full fine-tuning: 'trains all 1.23 M parameters')."""
    trainable, total = info.get("trainable", 0), info.get("total", 0)
    lora = info.get("lora")
    if not lora:
        return f"trains all {count_text(total)} parameters"
    share = f" ({100 * trainable / total:.2g}%)" if total else ""
    targets = lora.get("targets")
    targets = targets if isinstance(targets, str) else ",".join(targets or [])
    return (
        f"trains {count_text(trainable)} of {count_text(total)} parameters{share}: LoRA r={lora.get('r')} "
        f"alpha={lora.get('alpha'):g} on {targets}, experts {'adapted' if lora.get('experts') else 'frozen'}, "
        f"routers {lora.get('routers')}; the base frozen in {lora.get('base_dtype')}"
    )


def params_note(labelled: list[tuple[str, dict]]) -> str | None:
    """One `gspo compare` note: the trained parameters of each group ((label, params) pairs; runs
    without a record left out), or None when no run has one or none uses LoRA."""
    seen = {label: p for label, p in labelled if isinstance(p, dict) and p.get("total")}
    if not any(p.get("lora") for p in seen.values()):
        return None
    return "Trained parameters: " + "; ".join(f"{label} {param_line(p)}" for label, p in seen.items()) + "."
