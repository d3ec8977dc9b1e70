#!/usr/bin/python3
"""A small GPT on coupled attention (coupledqk.GPT), trained with torch.optim; prints the loss and the
validation perplexity.   PYTHONPATH=build/python examples/torch/train_gpt.py DATA [STEPS] [ATTENTION]
DATA: a text file (its bytes are the tokens), or a token folder of coupledqk-train (.cache/tokens/...)."""
import os, sys
import torch
import coupledqk

def tokens(path, split):  # -> (ids, vocabulary size)
    if os.path.isdir(path):  # train.bin / valid.bin: 32-byte header (magic, version, u32 vocab, ...), int32 ids
        raw = open(os.path.join(path, split + ".bin"), "rb").read()
        return torch.frombuffer(bytearray(raw[32:]), dtype=torch.int32).long(), int.from_bytes(raw[12:16], "little")
    data = torch.tensor(list(open(path, "rb").read()))
    return (data[: int(0.9 * len(data))] if split == "train" else data[int(0.9 * len(data)):]), 256

path, steps, attention = sys.argv[1], int((sys.argv[2:] or [200])[0]), (sys.argv[3:] or ["leapfrog"])[0]
(train, vocab), (valid, _), B, T = tokens(path, "train"), tokens(path, "valid"), 16, 64
torch.manual_seed(0)
model = coupledqk.GPT(vocab, dim=128, layers=2, heads=4, context=T, attention=attention, steps=1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
def batch(data, generator=None):
    i = torch.randint(len(data) - T - 1, (B,), generator=generator).tolist()
    return torch.stack([data[j:j + T] for j in i]), torch.stack([data[j + 1:j + T + 1] for j in i])
for step in range(steps):
    loss = model(*batch(train))[1]
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 10 == 0 or step == steps - 1: print(f"step {step} loss {loss.item():.4f}", flush=True)
with torch.no_grad():
    g = torch.Generator().manual_seed(1)
    valid_loss = torch.stack([model(*batch(valid, g))[1] for _ in range(20)]).mean()
print(f"valid loss {valid_loss:.4f} perplexity {valid_loss.exp():.2f}")
