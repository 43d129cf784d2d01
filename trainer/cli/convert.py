"""``trainer convert-checkpoint SRC DST``: turn a Lightning ``.ckpt`` file into a checkpoint directory that
``Trainer.fit(ckpt_path=DST)`` resumes and ``load_from_checkpoint(DST)`` loads (`strategies.lightning_checkpoint`).

torch and the converter are imported only when the command runs, so ``trainer --help`` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_convert_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "convert-checkpoint",
        help="convert a Lightning .ckpt file into a checkpoint directory",
        description="Read a Lightning .ckpt file safely (torch.load(weights_only=True) with an allow-list of the classes "
        "Lightning checkpoints hold) and write a checkpoint directory that Trainer.fit(ckpt_path=DST) resumes: model "
        "weights, optimizer and scheduler states, hyperparameters, epoch and global step.",
    )
    parser.add_argument("src", help="the Lightning checkpoint file (e.g. epoch=9-step=500.ckpt)")
    parser.add_argument("dst", help="the checkpoint directory to write (replaced once complete if it exists)")
    parser.set_defaults(func=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    from strategies.lightning_checkpoint import convert_lightning_checkpoint  # lazy: torch only when the command runs

    done = convert_lightning_checkpoint(args.src, args.dst)
    kind = "model weights only (resuming from it is refused)" if done["weights_only"] else (
        f"{done['optimizers']} optimizer(s), {done['schedulers']} scheduler(s)")
    print(f"wrote {done['path']}: {kind}; resumes at epoch {done['epoch']}, global step {done['global_step']}")
    if done["left_out"]:
        print(f"not carried over (Lightning-specific): {', '.join(done['left_out'])}")
    return 0
