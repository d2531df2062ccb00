"""A training run where rank 1's policy loss turns NaN at its second mini-batch (step 1),
and only there. Each rank writes its run's status to OUT_DIR/rank<R>.txt. Not a pytest module.

usage: nan_check.py SPEC_YAML OUT_DIR
"""

import os
import sys

import yaml

import gspo_cli.train.step as step_mod
from gspo_cli import distributed
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.train.loop import train_experiment
from gspo_cli.train.reporting import quiet_reporter


def poison(get_loss):
    calls = {"n": 0}

    def get(name):
        real = get_loss(name)

        def loss(*args, **kwargs):
            value, stats = real(*args, **kwargs)
            calls["n"] += 1
            if os.environ.get("RANK") == "1" and calls["n"] == 2:
                value = value * float("nan")
            return value, stats

        return loss

    return get


def main(spec_yaml: str, out_dir: str) -> None:
    step_mod.get_policy_loss = poison(step_mod.get_policy_loss)
    (res,) = train_experiment(spec_from_dict(yaml.safe_load(open(spec_yaml))), reporter=quiet_reporter())
    with open(os.path.join(out_dir, f"rank{os.environ.get('RANK', '0')}.txt"), "w") as f:
        f.write(res.status)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    distributed.leave_process_group(0, exit_now=True)
