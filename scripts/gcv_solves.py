"""Run ``hf-clroute`` with every RanPAC readout solve printed: examples seen, classes seen, the rule that
chose lambda (``gcv`` or ``relative``), lambda in units of the Gram matrix's mean eigenvalue, the Gram
matrix's rank, and the projection's dimension M.

Why: ``ranpac-gcv`` drops after wordnet's second task on some seeds (A_T is unaffected). This shows which
lambda GCV chose at each solve, e.g.

    python scripts/gcv_solves.py bench --suite wordnet --methods ranpac-gcv --seeds 0 --out gcv-solves \
        --selection results/wordnet/selection.json --precision fp32 --no-progress
"""
import sys

import torch

from hf_clroute.cli import main
from hf_clroute.heads import ranpac

solve = ranpac.RandomProjectionRidgeHead._solve


def printed_solve(head: ranpac.RandomProjectionRidgeHead) -> None:
    solve(head)
    examples = float(head.counts.sum())
    eigenvalues = torch.linalg.eigvalsh(head.gram)
    rank = int((eigenvalues > eigenvalues.max() * 1e-12).sum())
    print(f"[solve] examples={examples:.0f} classes={int((head.counts > 0).sum())} rule={head.solved_by} "
          f"lambda/mean_eigenvalue={head.solved_lambda / head.mean_eigenvalue():.3g} rank={rank} "
          f"M={head.projection_dim}", flush=True)


if __name__ == "__main__":
    ranpac.RandomProjectionRidgeHead._solve = printed_solve
    sys.argv = ["hf-clroute", *sys.argv[1:]]
    main()
