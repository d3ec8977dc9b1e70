#!/usr/bin/python3
"""Writes the hand-made seeds of the fuzz targets into tests/fuzz/corpus/<target>/.

Usage (Debian's python3, with numpy): tests/fuzz/make_seeds.py [--checkpoint-tool BUILD/examples/train/coupledqk-train]

Seeds: real layer cases (the parity tests' generator), small valid and invalid safetensors files,
the hostile inputs of issue 14 (a header nesting arrays 100,000 deep; a shape [2^62, 2, 0]), text
files for the corpus reader and token caches. With --checkpoint-tool, two real training
checkpoints of tiny models (standard and leapfrog) are written too, for the safetensors and the
checkpoint targets. Deterministic: the same files every time.
"""
import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "parity"))


def out(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def raw(header, data=b""):
    h = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    import numpy as np
    import cases
    import safetensors_io
    rng = np.random.default_rng(14)
    for variant, dtype in (("leapfrog", "F32"), ("diff-euler", "F64"), ("standard", "F32")):
        tensors, meta = cases.random_case(rng, variant, 2, B=1, T=3, D=4, H=2, m=2, dtype=dtype)
        out("safetensors", f"layer-{variant}-{dtype}.safetensors", safetensors_io.dumps(tensors, meta))
    out("safetensors", "empty-header.safetensors", raw("{}"))
    out("safetensors", "bf16-f16-i64.safetensors", raw(
        '{"__metadata__":{"k":"v"},"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},'
        '"b":{"dtype":"F16","shape":[1,2],"data_offsets":[4,8]},"c":{"dtype":"I64","shape":[],"data_offsets":[8,16]},'
        '"d":{"dtype":"BOOL","shape":[0,3],"data_offsets":[16,16]}}', bytes(range(16))))
    # Regression inputs of issue 14: a 200 KB header nesting arrays 100,000 deep (SIGSEGV in every
    # reader), and a shape whose dimensions multiply past 2^63 before a zero (numel() overflow).
    depth = 100000
    out("safetensors", "regression-deep-nesting.safetensors", raw('{"a":' + "[" * depth + "]" * depth + "}"))
    out("safetensors", "regression-numel-overflow.safetensors",
        raw('{"t":{"dtype":"F32","shape":[%d,2,0],"data_offsets":[0,0]}}' % (1 << 62)))


def checkpoint_seeds(tool):
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus")
        os.makedirs(corpus)
        import random
        rng = random.Random(14)
        syllables = "ka lo mi ren tas po su ve dan iro gel fu na ter qui bas ol yem zor ip".split()
        for i in range(30):
            paragraphs = []
            for _ in range(12):
                words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(6, 14))]
                paragraphs.append(" ".join(words).capitalize() + ".")
            with open(os.path.join(corpus, "doc%02d.txt" % i), "w") as f:
                f.write("\n\n".join(paragraphs) + "\n")
        for variant in ("standard", "leapfrog"):
            path = os.path.join(tmp, variant + ".safetensors")
            subprocess.run([tool, "--corpus", corpus, "--cache", os.path.join(tmp, "cache"), "--vocab", "400",
                            "--attention", variant, "--dim", "8", "--heads", "2", "--layers", "1", "--seq", "8",
                            "--batch", "2", "--tokens", "64", "--eval-every", "0", "--threads", "1",
                            "--progress", "off", "--checkpoint", path], check=True, stdout=subprocess.DEVNULL)
            with open(path, "rb") as f:
                data = f.read()
            out("checkpoint", "checkpoint-" + variant + ".safetensors", data)
            out("safetensors", "checkpoint-" + variant + ".safetensors", data)
        # A token cache of the same run: a real file for the token-cache target.
        for root, _, files in os.walk(os.path.join(tmp, "cache", "tokens")):
            for name in sorted(files):
                with open(os.path.join(root, name), "rb") as f:
                    out("token_cache", "cache-" + name, f.read())


def token_cache_seeds():
    def token_file(ids, vocab):
        payload = b"".join(struct.pack("<I", i) for i in ids)
        h = 14695981039346656037
        for b in payload:
            h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        return b"CQKTOKEN" + struct.pack("<IIQQ", 1, vocab, len(ids), h) + payload
    out("token_cache", "valid-512.bin", token_file([0, 1, 2, 511, 7, 3], 512))
    out("token_cache", "valid-8192.bin", token_file(list(range(0, 8192, 97)), 8192))
    out("token_cache", "empty-512.bin", token_file([], 512))
    out("token_cache", "count-overflow.bin", b"CQKTOKEN" + struct.pack("<IIQQ", 1, 512, (1 << 62) + 1, 0))


def corpus_seeds():
    out("corpus", "sections.txt", b"One.\n\n\nTwo.\n\n\nThree.\n\n\nFour.\n")
    out("corpus", "paragraphs.txt", b"\xef\xbb\xbfPara one.\r\n\r\nPara two.\r\rPara three.\n\nPara four \xc3\xa9.\n")
    out("corpus", "brown.txt", b"\tThe/at Fulton/np-tl County/nn-tl said/vbd ``/`` it/pps ''/'' ./.\n\n\tIt/pps n't/*\n")
    out("corpus", "binary.txt", bytes(range(256)))
    out("corpus", "invalid-utf8.txt", b"a" * 300 + b"\xff\xfe" + b"\n\nb\n\nc\n\nd\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-tool", help="a built coupledqk-train, to write real checkpoints")
    args = parser.parse_args()
    safetensors_seeds()
    token_cache_seeds()
    corpus_seeds()
    if args.checkpoint_tool:
        checkpoint_seeds(args.checkpoint_tool)


if __name__ == "__main__":
    main()
