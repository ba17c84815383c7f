#!/usr/bin/env python3
"""How long a running stream stalls while `magnetar serve` computes another request's long prompt.

    bench/serve_stall.py MODEL.gguf [--prompt-tokens N] [--rounds R] [--out FILE.jsonl] -- SERVE_FLAGS...

For each round: start stream A (max_tokens --a-tokens, temperature 0); once A has streamed --lead tokens, send B (a
prompt of --prompt-tokens, max_tokens 1, not streamed) and time it; record the gaps between A's tokens while B ran.
Then B alone (A finished) for its prefill time without a decoding neighbour. One server per call, started with
`--parallel 2` and SERVE_FLAGS; MAGNETAR names the binary (default build/tools/magnetar). Prints one JSON line per
round and the medians; the model needs a tokenizer whose byte tokens make a prompt of N characters N tokens
(`--make-model OUT.gguf` writes such a model: `magnetar synth` with a byte-level tokenizer, SYNTH_FLAGS from the
environment, default "--preset qwen3-30b-a3b --type q4_k --layers 8").
"""
import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time


# Qwen2's pre-tokenizer split (one of the patterns magnetar's tokenizer knows).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_level_tokenizer(folder):
    """An HF tokenizer folder: GPT-2's byte alphabet as the vocabulary (no merges: one token per byte)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for b in range(256):
        chars[b] = chr(b) if b in keep else chr(256 + extra)
        extra += b not in keep
    vocab = {chars[b]: b for b in range(256)}
    added = [{"id": 256, "content": "<|im_end|>", "special": True, "normalized": False},
             {"id": 257, "content": "<|pad|>", "special": True, "normalized": False}]
    tok = {"version": "1.0", "added_tokens": added, "normalizer": {"type": "NFC"},
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
               {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
           "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": vocab, "merges": [], "byte_fallback": False}}
    config = {"add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": {"content": "<|pad|>", "special": True},
              "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


def start_server(binary, model, flags):
    proc = subprocess.Popen([binary, "serve", "-m", model, "--port", "0", "--parallel", "2"] + flags,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "listening on http://" in line:
            port = int(line.split("listening on http://")[1].split(":")[1].split()[0])
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, port
    sys.exit("the server did not start:\n" + "".join(lines))


def post(port, body, on_event=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        sys.exit(f"status {r.status}: {r.read()[:300]}")
    if not body.get("stream"):
        return json.loads(r.read())
    while True:
        line = r.readline()
        if not line:
            return None
        line = line.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            on_event(json.loads(line[6:]))


def text(n, seed):
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(n))


def round_trip(port, args, seed):
    stamps, lead = [], threading.Event()

    def on_a(event):
        if event.get("choices") and event["choices"][0]["delta"].get("content"):
            stamps.append(time.monotonic())
            if len(stamps) == args.lead:
                lead.set()

    a_end = []

    def run_a():
        post(port, {"messages": [{"role": "user", "content": text(16, seed)}], "max_tokens": args.a_tokens,
                    "temperature": 0, "stream": True}, on_a)
        a_end.append(time.monotonic())

    a = threading.Thread(target=run_a)
    a.start()
    lead.wait()
    t0 = time.monotonic()
    post(port, {"messages": [{"role": "user", "content": text(args.prompt_tokens, seed + 1)}], "max_tokens": 1,
                "temperature": 0})
    t1 = time.monotonic()
    a.join()
    during = [t for t in stamps if t0 <= t <= t1]
    if a_end[0] < t1:
        sys.exit(f"A ended {t1 - a_end[0]:.1f} s before B: raise --a-tokens")
    edges = [t0] + during + [t1]
    gaps = [y - x for x, y in zip(edges, edges[1:])]
    t2 = time.monotonic()
    post(port, {"messages": [{"role": "user", "content": text(args.prompt_tokens, seed + 2)}], "max_tokens": 1,
                "temperature": 0})
    alone = time.monotonic() - t2
    return {"b_seconds": t1 - t0, "a_tokens_during_b": len(during), "a_max_gap_s": max(gaps),
            "b_alone_seconds": alone, "a_tokens": len(stamps)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--make-model", action="store_true", help="write MODEL (synth + byte tokenizer) and exit")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--a-tokens", type=int, default=200)
    p.add_argument("--lead", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:cut])
    args.flags = argv[cut + 1:]
    binary = os.environ.get("MAGNETAR", "build/tools/magnetar")
    if args.make_model:
        with tempfile.TemporaryDirectory() as d:
            byte_level_tokenizer(d)
            synth = os.environ.get("SYNTH_FLAGS", "--preset qwen3-30b-a3b --type q4_k --layers 8").split()
            subprocess.run([binary, "synth"] + synth + ["--tokenizer", d, "-o", args.model], check=True)
        return
    proc, port = start_server(binary, args.model, args.flags)
    rows = []
    try:
        for r in range(args.rounds):
            row = round_trip(port, args, 1000 * r)
            row["round"] = r
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        proc.terminate()
        proc.wait()
    summary = {k: statistics.median(row[k] for row in rows) for k in rows[0] if k != "round"}
    summary["flags"] = " ".join(args.flags)
    print("median " + json.dumps(summary), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps(dict(row, flags=summary["flags"])) + "\n")


if __name__ == "__main__":
    main()
