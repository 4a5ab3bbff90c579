"""Peak memory of training over a streamed parquet source, against the stream's size.

    python training/stream_memory.py --rows 1000 4000 16000

For each size, writes ``rows`` training images (64x64 RGB PNG noise, 12 kB each, 4 classes,
parquet shards of 250 rows: a longer stream has more shards, as on the Hub) and trains fine-tuning of a
tiny ViT over the 2-task stream in a fresh process (``class_incremental_streaming``, batch 50, one pass),
then prints the stream's size on disk and the training process's peak resident memory (``VmHWM``). A
stream that is never materialised leaves the peak where the smallest stream put it.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

SIDE, CLASSES, SHARD_ROWS, BATCH = 64, 4, 250, 50


def run_one(source: Path) -> dict:
    """Fine-tune a tiny ViT over the 2-task stream of ``source`` in this process; what the table reports."""
    import torch
    from transformers import ViTModel

    from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
    from hf_clroute.backbones.catalog import tiny_vit_config
    from hf_clroute.baselines import FinetuneConfig
    from hf_clroute.data import ImageCollator, class_incremental_streaming
    from hf_clroute.engine import make_accelerator

    stream = class_incremental_streaming(source, n_tasks=2, seed=0)
    config = TrainingConfig(batch_size=BATCH, progress=False, num_workers=0)
    torch.manual_seed(0)
    model = get_cl_model(ViTModel(tiny_vit_config()), FinetuneConfig())
    collator = ImageCollator(16, num_channels=3)
    result = ContinualTrainer(model, stream, config, collator, make_accelerator(config, cpu=True)).fit()
    return {"steps": result.global_step, "finished": result.finished, "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """This process's peak resident memory. ``VmHWM`` where Linux has it: ``ru_maxrss`` carries the
    parent's peak across ``exec``, and the parent has just written the stream."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(rows: int, root: Path, side: int = SIDE) -> dict:
    from hf_clroute.testing.parquet_stream import write_parquet_stream

    source = root / f"rows-{rows}"
    size = write_parquet_stream(source, per_class=rows // CLASSES, shards=max(1, rows // SHARD_ROWS), side=side,
                                test_per_class=10)
    out = subprocess.run([sys.executable, __file__, "--one", str(source)], check=True, capture_output=True, text=True)
    return {"rows": rows, "stream_mb": round(size / 2**20, 1), **json.loads(out.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 4000, 16000], help="training rows per stream")
    parser.add_argument("--side", type=int, default=SIDE, help="image side in pixels (rows are ~3*side^2 bytes)")
    parser.add_argument("--dir", default=None, help="where the streams are written (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child: train over one stream
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(Path(args.one))))
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        table = [measure(rows, Path(root), args.side) for rows in args.rows]
    if args.json:
        print(json.dumps(table))
        return
    print("| training rows | stream on disk (MB) | steps | peak RSS (MB) |\n|---:|---:|---:|---:|")
    for row in table:
        print(f"| {row['rows']} | {row['stream_mb']} | {row['steps']} | {row['peak_rss_mb']:.0f} |")


if __name__ == "__main__":
    main()
