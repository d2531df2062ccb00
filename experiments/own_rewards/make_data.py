"""Writes train.jsonl: templated integer arithmetic in TRL's standard prompt format.

Each row: `prompt` (a string), `answer` (what the accuracy reward checks) and `solution` (the
reference completion the built-in model's cold start learns the format from). Deterministic:
rerunning it rewrites the same file. Run from the repository root:

    python experiments/own_rewards/make_data.py
"""

import json
import random
from pathlib import Path

ROWS = 300


def main() -> None:
    rng = random.Random(0)
    seen, rows = set(), []
    while len(rows) < ROWS:
        a, b, op = rng.randint(0, 30), rng.randint(0, 30), rng.choice("+-")
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        value = a + b if op == "+" else a - b
        rows.append(
            {
                "prompt": f"What is {a} {op} {b}? Put the answer in \\boxed{{}}.\n",
                "answer": str(value),
                "solution": f"{a} {op} {b} = {value}. \\boxed{{{value}}}",
            }
        )
    out = Path(__file__).with_name("train.jsonl")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {out} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
