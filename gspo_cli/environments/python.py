"""`python`, the built-in tool environment: the last fenced ```python block of a turn runs in the
sandbox as a fresh process (nothing kept between calls); its stdout comes back, or the error's last
line, or the time-out. A turn without a block ends the rollout."""

from __future__ import annotations

from gspo_cli.environments.protocol import Observation, last_python_block
from gspo_cli.sandbox.programs import run_program


class PythonTool:
    """`python`: runs the turn's last ```python block in the sandbox (a fresh process per call)."""

    def __init__(self, timeout_s: float = 2.0, memory_mb: int = 256, output_limit_bytes: int = 1 << 16):
        self.timeout_s, self.memory_mb, self.output_limit_bytes = (
            float(timeout_s),
            int(memory_mb),
            int(output_limit_bytes),
        )

    def start(self, prompt: str) -> None:
        return None

    def step(self, turn: str) -> Observation:
        code = last_python_block(turn)
        if code is None:
            return Observation(None, done=True)
        res = run_program(
            code, timeout_s=self.timeout_s, memory_mb=self.memory_mb, output_limit_bytes=self.output_limit_bytes
        )
        if res.status == "ok":
            return Observation(res.stdout)
        if res.status == "timeout":
            return Observation(f"TimeoutError: stopped after {self.timeout_s:g} s", error=True, timeout=True)
        if res.status == "memory":
            return Observation(f"MemoryError: over {self.memory_mb} MB", error=True)
        if res.status == "output_limit":
            return Observation(res.stdout + f"\n[output stopped at {self.output_limit_bytes} bytes]", error=True)
        lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
        return Observation(res.stdout + (lines[-1] if lines else f"error (exit status {res.returncode})"), error=True)
