#!/usr/bin/python3
"""The whole-model example (examples/torch/train_gpt.py) trains: 31 AdamW steps of the byte-level
GPT on a text file, and the loss falls well below its start (ln 256 = 5.55 at init) and the
validation perplexity is finite.

    test_example.py --example examples/torch/train_gpt.py --text docs/method.md
"""
import argparse
import math
import re
import subprocess
import sys

from harness import main

ARGS = None


def test_the_example_gpt_trains():
    done = subprocess.run([sys.executable, ARGS.example, ARGS.text, "31", "leapfrog"], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    losses = [float(v) for v in re.findall(r"^step \d+ loss ([0-9.]+)$", done.stdout, re.M)]
    assert len(losses) == 4, done.stdout  # steps 0, 10, 20, 30
    assert abs(losses[0] - math.log(256)) < 0.3, losses  # near uniform at init
    assert losses[-1] < losses[0] - 1.0, losses
    valid = re.search(r"^valid loss ([0-9.]+) perplexity ([0-9.]+)$", done.stdout, re.M)
    assert valid and float(valid.group(1)) < losses[0] - 1.0, done.stdout
    print("     losses:", losses, "valid:", valid.group(0))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", required=True)
    ap.add_argument("--text", required=True)
    ARGS = ap.parse_args()
    main(globals())
