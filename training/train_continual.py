"""Train one continual method over one suite's stream, under `accelerate launch`.

An example script over the installed package's own command, ``hf-clroute train``
(``hf_clroute.commands.train``): the same run configs, checkpoints and resume.

    accelerate launch training/train_continual.py --config configs/runs/split-mnist-finetune.json

Two CPU processes on one machine:

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
        --mixed_precision no --dynamo_backend no training/train_continual.py --config ...

The run config is JSON: {"suite": <built-in name | suite JSON path | inline suite>,
"method": <name>, "seed": 0, "quick": false, "training": {TrainingConfig overrides},
"output_dir": "runs/...", "from_adapter": <optional adapter dir or Hub repo id>}.
With "from_adapter" the run continues that adapter on the suite's stream (classes it
knows keep their ids, new ones come after them; "method" must be the adapter's).
Checkpoints go to <output_dir>/checkpoints; pass --resume to continue a stopped run
from its latest checkpoint (every option of `hf-clroute train` is accepted).

Several machines and sharded models: configs/accelerate/two-nodes.yaml, configs/accelerate/fsdp2.yaml
and README "Scaling out".
"""

from __future__ import annotations

import argparse
import sys

from hf_clroute.cli import main as cli_main
from hf_clroute.commands.train import load_run_config as _load
from hf_clroute.commands.train import train


def load_run_config(path: str) -> dict:
    """The run config at ``path``, checked (see ``hf_clroute.commands.train.load_run_config``)."""
    return _load(path)


def training_function(config: dict, args: argparse.Namespace) -> dict:
    """One run: ``args.resume`` continues from the latest checkpoint, ``args.stop_after_steps`` stops
    (resumably) after that many global steps."""
    flags = {"stop_after_steps": args.stop_after_steps} if args.stop_after_steps else {}
    return train(config, resume="resume" if args.resume else None, flags=flags)


if __name__ == "__main__":
    sys.exit(cli_main(["train", *sys.argv[1:]]))
