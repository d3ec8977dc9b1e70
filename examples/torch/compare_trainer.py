#!/usr/bin/python3
"""coupledqk.GPT trained in PyTorch with coupledqk-train's recipe, for a perplexity comparison with
the C++ trainer on the same tokens and budget.

    PYTHONPATH=build/python examples/torch/compare_trainer.py TOKENS_DIR [--attention leapfrog]
        [--steps 1] [--seed 1] [--threads 2]

TOKENS_DIR is coupledqk-train's token folder for a corpus (<cache>/tokens/<corpus key>/: train.bin,
valid.bin, written by the C++ pipeline, so both trainers see the same token ids). The recipe is
coupledqk-train's defaults (docs/training.md): D=128, L=2, H=4, T=128, B=16, 524,288 training
tokens (256 steps), AdamW (beta 0.9, 0.95, eps 1e-8, weight decay 0.1 on 2-D tensors only),
learning rate 2e-3 with a linear warm-up over 5% of the steps and a cosine decay to 10%, global
gradient-norm clipping at 1.0; validation perplexity over the whole validation split in
non-overlapping windows of T tokens. What differs: the batches (torch's generator draws the window
offsets, not the trainer's), the initial values (drawn by torch, except the attention layers', which
are the library's own from a seed), and clip_grad_norm_'s 1e-6 in the denominator.
"""
import argparse
import math
import os
import struct
import time

import torch

import coupledqk


def read_tokens(folder, split):
    """A token file of coupledqk-train: 32-byte header (magic CQKTOKEN, u32 version, u32 vocab, u64
    count, u64 checksum), then count little-endian int32 ids."""
    raw = open(os.path.join(folder, split + ".bin"), "rb").read()
    magic, _, vocab, count, _ = struct.unpack("<8sIIQQ", raw[:32])
    if magic != b"CQKTOKEN" or len(raw) != 32 + 4 * count:
        raise ValueError(f"{folder}/{split}.bin is not a coupledqk-train token file ({magic!r}, {len(raw)} bytes)")
    return torch.frombuffer(bytearray(raw[32:]), dtype=torch.int32).long(), vocab


def lr_at(step, total, warmup, lr, min_lr):
    if step < warmup:
        return lr * (step + 1) / warmup
    ratio = (step - warmup) / (total - warmup)
    return min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (lr - min_lr)


@torch.no_grad()
def valid_perplexity(model, stream, T, B):
    W, total = T, 0.0
    count = (len(stream) - 1) // W
    for i in range(0, count, B):
        nb = min(B, count - i)
        idx = torch.arange(i, i + nb) * W
        tokens = torch.stack([stream[s:s + W] for s in idx.tolist()])
        targets = torch.stack([stream[s + 1:s + 1 + W] for s in idx.tolist()])
        total += model(tokens, targets)[1].item() * nb * W
    return math.exp(total / (count * W))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tokens")
    ap.add_argument("--attention", default="leapfrog")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    train, vocab = read_tokens(args.tokens, "train")
    valid, _ = read_tokens(args.tokens, "valid")
    D, L, H, T, B, budget, lr = 128, 2, 4, 128, 16, 524_288, 2e-3
    total = math.ceil(budget / (B * T))
    warmup = min(total, max(1, round(0.05 * total)))
    torch.manual_seed(args.seed)
    model = coupledqk.GPT(vocab, D, L, H, T, attention=args.attention, steps=args.steps)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    t0, losses = time.perf_counter(), []
    for step in range(total):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total, warmup, lr, 0.1 * lr)
        offsets = torch.randint(len(train) - T, (B,)).tolist()
        tokens = torch.stack([train[s:s + T] for s in offsets])
        targets = torch.stack([train[s + 1:s + T + 1] for s in offsets])
        loss = model(tokens, targets)[1]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - t0
    ppl = valid_perplexity(model, valid, T, B)
    print(f"attention {args.attention} steps {args.steps} seed {args.seed}: {total} steps, "
          f"{total * B * T / seconds:.0f} tokens/s, final train loss {sum(losses[-20:]) / len(losses[-20:]):.4f}, "
          f"valid ppl {ppl:.2f}")


if __name__ == "__main__":
    main()
