"""Pretrain a small stand-in ViT backbone in CPU minutes: the command line over
:mod:`hf_clroute.backbones.pretraining.vit` (the training code lives in the package).

    python training/pretrain_vit.py --recipe vit-mnist-stream --out ~/.cache/hf_clroute/models/vit-mnist-stream
    accelerate launch training/pretrain_vit.py --recipe vit-fashion-stream --out runs/vit-fashion

With ``--asset`` the build is also stored as the package's committed asset of the recipe, which
``hf_clroute.backbones.pretraining.vit.pretrained_vit_path(recipe)`` installs instead of training:

    python training/pretrain_vit.py --recipe vit-mnist-stream --out runs/vit-mnist-stream --asset
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

try:
    import hf_clroute  # noqa: F401
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from accelerate import PartialState  # noqa: E402

from hf_clroute.backbones.pretraining.recipes import RECIPES, assets_root, write_asset  # noqa: E402
from hf_clroute.backbones.pretraining.vit import DEFAULTS, training_function  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description="Pretrain a small stand-in ViT backbone (hf_clroute.backbones.pretraining.vit).")
    parser.add_argument("--recipe", required=True, choices=sorted(RECIPES))
    parser.add_argument("--out", required=True, help="output directory (checkpoint + pretrain_report.json)")
    parser.add_argument("--steps", type=int, default=None, help="default: the recipe's, else DEFAULTS['steps']")
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    parser.add_argument("--batch-size", type=int, default=None,
                        help="labelled source images per step (and unlabelled target images, x2 views); "
                             "default: the recipe's, else DEFAULTS['batch_size']")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N images per split (smoke tests)")
    parser.add_argument("--asset", nargs="?", const=str(assets_root()), default=None, metavar="ROOT",
                        help="also store the result as the package's committed asset, ROOT/<recipe> "
                             "(default ROOT: hf_clroute/backbones/pretraining/assets), "
                             "which pretrained_vit_path installs")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    report = training_function(args.recipe, args.out, steps=args.steps, seed=args.seed, batch_size=args.batch_size,
                               target_batch_size=args.batch_size, limit=args.limit,
                               probe_train_limit=args.limit, probe_test_limit=args.limit)
    if args.asset is not None and PartialState().is_main_process:
        print(f"asset: {write_asset(args.out, args.recipe, args.asset)}")
    return report


if __name__ == "__main__":
    main()
