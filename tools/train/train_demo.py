#!/usr/bin/env python3
"""Trains Magnetar's bundled demo model: a ~32M-parameter Qwen3-MoE (hidden 256, 8 layers, 16 experts top-4) on the Debian-package corpus, on one GPU.

Runs on the device machine (torch 2.11, tokenizers, transformers 5.17, safetensors, numpy; offline) in one
call of at most 10 minutes; tools/train/README.md has the exact call. Steps, each logged with its time:
  1. data       build/corpus/pretrain.tar.gz and chat.tar.gz from make_corpus.py (or the plain files beside them)
  2. tokenizer  byte-level BPE trained with HF `tokenizers` (vocab 8192 with the added tokens), NFC normaliser,
                the Qwen2 pre-tokenizer regex (so magnetar's tokenizer import names it "qwen2"), added tokens
                <|endoftext|> <|im_start|> <|im_end|> (special) and <think> </think> (as Qwen3 has them)
  3. model      Qwen3MoeForCausalLM geometry, written here in plain PyTorch (dense-dispatch MoE: every expert
                computes every token and the router's top-k weights, zero elsewhere, select; the same function
                as the sparse form, and two large matmuls per layer instead of a loop over experts)
  4. pretrain   next-token loss on random 512-token windows of train.txt, AdamW, bf16 autocast, linear warm-up
                then a cosine learning rate over a WALL-CLOCK budget (--minutes), router load-balancing loss
  5. chat       ChatML conversations of 1-3 turns from chat.jsonl (loss on the assistant's tokens only; the last
                answer opens with Qwen3's empty "<think>\\n\\n</think>\\n\\n"), mixed with 20% pretraining rows
  6. eval       held-out loss and perplexity (all positions, and llama.cpp's windowed second half), held-out chat
                loss, expert usage, greedy samples
  7. export     HF folder: config.json (published Qwen3 style), model.safetensors (bf16, per-expert names),
                tokenizer.json, tokenizer_config.json (ChatML chat_template, eos <|im_end|>),
                generation_config.json, README.md; checked by loading it back with transformers and with
                tools/reference/check_fixture.py's numpy forward; packed as ONE tar split into <= 15 MiB parts
                (OUT/demo-hf.tar.NN; join with `cat demo-hf.tar.?? > demo-hf.tar`), with OUT/report.json and
                OUT/train.log

The HF folder is also the checkpoint: --init-from DIR continues from it (weights and tokenizer; the optimizer
state is not kept, the warm-up covers that), e.g. --init-from DIR --minutes 0 redoes only the chat phase.

--smoke runs the whole pipeline on a tiny model and a slice of the data in well under a minute (on a GPU) so a
device call can check every step before spending its budget; without `tokenizers` (this repo's dev machines)
it falls back to a byte-level stand-in tokenizer, which --smoke alone allows.

Usage: train_demo.py [--data build/corpus] [--out $OUT] [--minutes 5] [--smoke] [--init-from DIR] [...]
"""
import argparse
import hashlib
import io
import json
import math
import os
import random
import re
import struct
import sys
import tarfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

T0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# The Qwen2 / Qwen3 pre-tokenizer regex, byte for byte as tokenizer/hf_import.cpp's kQwen2Regex detects it.
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
EOT, IM_START, IM_END, THINK, END_THINK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"
SPECIAL = [EOT, IM_START, IM_END]
ADDED = [THINK, END_THINK]
THINK_EMPTY = "<think>\n\n</think>\n\n"
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are Magnetar's demo model.", "Answer briefly."]

# Qwen3-style ChatML template (no tools): earlier assistant turns lose their <think> block; with
# enable_thinking=false the generation prompt carries an empty one. magnetar's chat/chatml.cpp renders the same.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- set content = message['content'] %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


# ---------------------------------------------------------------------------------------------------------
# Logging


class Log:
    def __init__(self):
        self.file = None

    def open(self, path):
        self.file = open(path, "a", encoding="utf-8")

    def __call__(self, msg):
        line = f"[{time.time() - T0:7.1f}s] {msg}"
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()


log = Log()


# ---------------------------------------------------------------------------------------------------------
# Data


def read_member(data_dir, archive, name, required=True):
    """DATA/NAME if present, else NAME from DATA/ARCHIVE (a make_corpus.py .tar.gz); None if neither exists
    and not required."""
    plain = os.path.join(data_dir, name)
    if os.path.exists(plain):
        with open(plain, encoding="utf-8") as f:
            return f.read()
    path = os.path.join(data_dir, archive)
    if not os.path.exists(path):
        if not required:
            return None
        raise SystemExit(f"train_demo.py: neither {plain} nor {path} exists (run tools/train/make_corpus.py)")
    with tarfile.open(path, "r:gz") as tar:
        return tar.extractfile(tar.getmember(name)).read().decode("utf-8")


def split_docs(text):
    docs = text.split(EOT + "\n")
    return [d for d in docs if d.strip()]


def read_pairs(text):
    out = []
    for line in text.splitlines():
        if line.strip():
            j = json.loads(line)
            out.append((j["user"], j["assistant"]))
    return out


# ---------------------------------------------------------------------------------------------------------
# Tokenizers


def tokenizer_spec():
    """tokenizer.json of an untrained Qwen2-family byte-level BPE, as Qwen3's own file has these fields."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {}, "merges": []},
    }


class HFTokenizer:
    """HF `tokenizers` byte-level BPE (what ships)."""

    def __init__(self, tok):
        self.tok = tok
        self.n = tok.get_vocab_size(with_added_tokens=True)

    @staticmethod
    def train(texts, vocab_size, n_texts):
        from tokenizers import AddedToken, Tokenizer, pre_tokenizers, trainers
        try:
            tok = HFTokenizer.untrained()
        except Exception as e:  # noqa: BLE001 (a tokenizers whose constructors differ: build it from JSON)
            log(f"tokenizer: constructors failed ({type(e).__name__}: {e}); building it from tokenizer_spec()")
            tok = Tokenizer.from_str(json.dumps(tokenizer_spec()))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIAL) - len(ADDED), min_frequency=2,
                                      show_progress=False, special_tokens=[],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer=trainer, length=n_texts)
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
        return HFTokenizer(tok)

    @staticmethod
    def untrained():
        """Qwen2-style byte-level BPE pipeline, empty vocabulary: what tokenizer_spec() describes."""
        from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        return tok

    @staticmethod
    def load(path):
        from tokenizers import Tokenizer
        return HFTokenizer(Tokenizer.from_file(path))

    def id(self, text):
        i = self.tok.token_to_id(text)
        if i is None:
            raise SystemExit(f"train_demo.py: tokenizer has no token {text!r}")
        return i

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_many(self, texts):
        fast = getattr(self.tok, "encode_batch_fast", None)
        encs = (fast or self.tok.encode_batch)(texts, add_special_tokens=False)
        return [e.ids for e in encs]

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def save(self, folder):
        self.tok.save(os.path.join(folder, "tokenizer.json"))

    def check(self):
        """The file must be what magnetar's tokenizer import accepts as a Qwen2-family byte-level BPE."""
        j = json.loads(self.tok.to_str())
        pre = j["pre_tokenizer"]
        assert pre["type"] == "Sequence" and pre["pretokenizers"][0]["type"] == "Split", pre
        assert pre["pretokenizers"][0]["pattern"]["Regex"] == QWEN2_REGEX, pre
        assert j["model"]["type"] == "BPE" and not j["model"].get("byte_fallback"), j["model"]["type"]
        assert j["decoder"]["type"] == "ByteLevel", j["decoder"]
        assert j["normalizer"]["type"] == "NFC", j["normalizer"]
        ids = {a["content"]: (a["id"], a["special"]) for a in j["added_tokens"]}
        for t in SPECIAL:
            assert ids[t][1], t
        for t in ADDED:
            assert not ids[t][1], t
        return {"vocab_size_with_added": self.n, "bpe_vocab": len(j["model"]["vocab"]),
                "merges": len(j["model"]["merges"]), "added": {k: v[0] for k, v in ids.items()}}


class ByteTokenizer:
    """Stand-in for --smoke where `tokenizers` is missing: bytes 0-255, then the added tokens."""

    def __init__(self):
        self.added = {t: 256 + i for i, t in enumerate(SPECIAL + ADDED)}
        self.n = 256 + len(self.added)
        self.split = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL + ADDED) + ")")

    def id(self, text):
        return self.added[text]

    def encode(self, text):
        out = []
        for part in self.split.split(text):
            if part in self.added:
                out.append(self.added[part])
            elif part:
                out.extend(part.encode("utf-8"))
        return out

    def encode_many(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        inv = {v: k for k, v in self.added.items()}
        out, buf = [], bytearray()
        for i in ids:
            if i in inv:
                out.append(buf.decode("utf-8", "replace"))
                buf = bytearray()
                out.append(inv[i])
            elif i < 256:
                buf.append(i)
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)

    def save(self, folder):
        pass

    def check(self):
        return {"vocab_size_with_added": self.n, "stand_in": "bytes (no `tokenizers` here)"}


def has_tokenizers():
    try:
        import tokenizers  # noqa: F401
        return True
    except ImportError:
        return False


# ---------------------------------------------------------------------------------------------------------
# Token streams and rows


def encode_stream(tok, docs, eot, chunk=4000):
    """Documents joined by EOT (each document followed by it), int32."""
    parts = []
    for i in range(0, len(docs), chunk):
        for ids in tok.encode_many(docs[i:i + chunk]):
            parts.append(np.asarray(ids + [eot], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def build_conversations(pairs, rng, multi_turn=True):
    pairs = list(pairs)
    rng.shuffle(pairs)
    convs, i = [], 0
    while i < len(pairs):
        r = rng.random()
        n = 1 if (not multi_turn or r < 0.6) else (2 if r < 0.9 else 3)
        system = rng.choice(SYSTEM_PROMPTS) if multi_turn and rng.random() < 0.15 else None
        convs.append((system, pairs[i:i + n]))
        i += n
    return convs


def conversation_segments(system, turns):
    """[(text, is_assistant)], rendered as magnetar's chat/chatml.cpp and the chat template do. Every segment
    boundary falls next to an added token or between "assistant\\n" and the answer, where the Qwen2 regex
    splits anyway, so encoding segment by segment gives the ids of the whole string (checked on the device)."""
    segs = []
    if system:
        segs.append((f"{IM_START}system\n{system}{IM_END}\n", False))
    for j, (user, answer) in enumerate(turns):
        last = j == len(turns) - 1
        segs.append((f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n", False))
        segs.append(((THINK_EMPTY if last else "") + answer + IM_END, True))
        segs.append(("\n", False))
    return segs


def encode_conversations(tok, convs):
    texts, owners = [], []
    for ci, (system, turns) in enumerate(convs):
        for text, is_asst in conversation_segments(system, turns):
            texts.append(text)
            owners.append((ci, is_asst))
    ids_list = []
    for i in range(0, len(texts), 20000):
        ids_list.extend(tok.encode_many(texts[i:i + 20000]))
    samples = [([], []) for _ in convs]
    for (ci, is_asst), ids in zip(owners, ids_list):
        samples[ci][0].extend(ids)
        samples[ci][1].extend([1 if is_asst else 0] * len(ids))
    return samples


def pack_rows(samples, row_len, eot):
    """Greedy packing of (ids, mask) samples, each followed by EOT, into rows of row_len; never splits one."""
    rows, masks, cur, cm, dropped = [], [], [], [], 0
    for ids, m in samples:
        ids, m = ids + [eot], m + [0]
        if len(ids) > row_len:
            dropped += 1
            continue
        if len(cur) + len(ids) > row_len:
            pad = row_len - len(cur)
            rows.append(cur + [eot] * pad)
            masks.append(cm + [0] * pad)
            cur, cm = [], []
        cur, cm = cur + ids, cm + m
    if cur:
        pad = row_len - len(cur)
        rows.append(cur + [eot] * pad)
        masks.append(cm + [0] * pad)
    return np.asarray(rows, np.int32).reshape(-1, row_len), np.asarray(masks, np.uint8).reshape(-1, row_len), dropped


# ---------------------------------------------------------------------------------------------------------
# The model: Qwen3-MoE (every layer MoE), parameter names as transformers' except the stacked experts


class Config:
    def __init__(self, **kw):
        self.vocab = kw["vocab"]
        self.hidden = kw["hidden"]
        self.layers = kw["layers"]
        self.heads = kw["heads"]
        self.kv_heads = kw["kv_heads"]
        self.head_dim = kw["head_dim"]
        self.experts = kw["experts"]
        self.top_k = kw["top_k"]
        self.moe_inter = kw["moe_inter"]
        self.rope_theta = kw["rope_theta"]
        self.eps = kw.get("eps", 1e-6)
        self.max_pos = kw["max_pos"]

    def hf(self, bos, eos):
        """config.json as the published Qwen3-MoE checkpoints write it (make_fixtures.py's style)."""
        c = {
            "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": bos, "decoder_sparse_step": 1, "eos_token_id": eos, "head_dim": self.head_dim,
            "hidden_act": "silu", "hidden_size": self.hidden, "initializer_range": 0.02,
            "intermediate_size": self.moe_inter * self.top_k, "max_position_embeddings": self.max_pos,
            "max_window_layers": self.layers, "mlp_only_layers": [], "model_type": "qwen3_moe",
            "moe_intermediate_size": self.moe_inter, "norm_topk_prob": True,
            "num_attention_heads": self.heads, "num_experts": self.experts, "num_experts_per_tok": self.top_k,
            "num_hidden_layers": self.layers, "num_key_value_heads": self.kv_heads,
            "output_router_logits": False, "rms_norm_eps": self.eps, "rope_scaling": None,
            "rope_theta": self.rope_theta, "router_aux_loss_coef": 0.001, "sliding_window": None,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
            "use_sliding_window": False, "vocab_size": self.vocab,
        }
        return dict(sorted(c.items()))

    @staticmethod
    def from_hf(c):
        return Config(vocab=c["vocab_size"], hidden=c["hidden_size"], layers=c["num_hidden_layers"],
                      heads=c["num_attention_heads"], kv_heads=c["num_key_value_heads"],
                      head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                      experts=c.get("num_experts") or c["num_local_experts"], top_k=c["num_experts_per_tok"],
                      moe_inter=c["moe_intermediate_size"], rope_theta=c["rope_theta"], eps=c["rms_norm_eps"],
                      max_pos=c["max_position_embeddings"])

    def n_params(self):
        H, L = self.hidden, self.layers
        attn = H * self.heads * self.head_dim * 2 + H * self.kv_heads * self.head_dim * 2 + 2 * self.head_dim
        moe = self.experts * H + self.experts * 3 * H * self.moe_inter
        return L * (attn + moe + 2 * H) + 2 * self.vocab * H + H

    def check(self):
        for name, v in (("hidden", self.hidden), ("heads*head_dim", self.heads * self.head_dim),
                        ("moe_inter", self.moe_inter), ("kv_heads*head_dim", self.kv_heads * self.head_dim)):
            if v % 32:
                raise SystemExit(f"train_demo.py: {name} = {v} is not a multiple of 32 (Q8_0 blocks)")
        if self.heads % self.kv_heads:
            raise SystemExit("train_demo.py: heads must be a multiple of kv_heads")


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):  # transformers' Qwen3RMSNorm
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(cfg, n, device):
    """transformers' default RoPE: float32 inv_freq and angles, halves rotated (NeoX style)."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim))
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1).to(device)
    return ang.cos(), ang.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        H, hd = cfg.hidden, cfg.head_dim
        self.q_proj = nn.Linear(H, cfg.heads * hd, bias=False)
        self.k_proj = nn.Linear(H, cfg.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(H, cfg.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.heads * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, cfg.eps)
        self.k_norm = RMSNorm(hd, cfg.eps)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        c = self.cfg
        q = self.q_norm(self.q_proj(x).view(B, T, c.heads, c.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, c.kv_heads, c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        q, k = q.to(v.dtype), k.to(v.dtype)
        rep = c.heads // c.kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (the CPU smoke test on Debian's torch 1.13)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim)
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            y = s.softmax(-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, c.heads * c.head_dim))


class MoE(nn.Module):
    """Qwen3-MoE sparse block: softmax router (float32), top-k, renormalised (norm_topk_prob), SwiGLU experts.
    Dense dispatch: h = x @ [gate_0 .. gate_E-1]^T etc. for all experts at once, the non-selected experts'
    outputs multiplied by weight 0. experts_gate / experts_up are [E, I, H], experts_down [E, H, I]: the
    published per-expert gate_proj / up_proj / down_proj weights stacked."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        E, I, H = cfg.experts, cfg.moe_inter, cfg.hidden
        self.gate = nn.Linear(H, E, bias=False)
        self.experts_gate = nn.Parameter(torch.empty(E, I, H))
        self.experts_up = nn.Parameter(torch.empty(E, I, H))
        self.experts_down = nn.Parameter(torch.empty(E, H, I))
        self.usage = None  # set to a tensor [E] to count selections (eval only)

    def forward(self, x):
        B, T, H = x.shape
        c = self.cfg
        E, I, K = c.experts, c.moe_inter, c.top_k
        x2 = x.reshape(B * T, H)
        with torch.autocast(device_type=x.device.type, enabled=False):
            logits = F.linear(x2.float(), self.gate.weight.float())
        probs = logits.softmax(dim=-1)
        top_w, top_i = probs.topk(K, dim=-1)
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        w = torch.zeros_like(probs).scatter(1, top_i, top_w)  # [N, E], top-k weights, 0 elsewhere
        g = F.linear(x2, self.experts_gate.reshape(E * I, H))
        u = F.linear(x2, self.experts_up.reshape(E * I, H))
        a = (F.silu(g) * u).view(-1, E, I) * w.to(g.dtype).unsqueeze(-1)
        y = F.linear(a.reshape(-1, E * I), self.experts_down.permute(1, 0, 2).reshape(H, E * I))
        # Switch-style load balancing: E * sum_e (share of top-k slots routed to e) * (mean router prob of e).
        share = F.one_hot(top_i, E).float().sum(dim=(0, 1)) / (top_i.numel())
        aux = E * (share * probs.mean(dim=0)).sum()
        if self.usage is not None:
            self.usage += torch.bincount(top_i.reshape(-1), minlength=E).to(self.usage.dtype)
        return y.view(B, T, H), aux


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.mlp = MoE(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        y, aux = self.mlp(self.post_attention_layernorm(x))
        return x + y, aux


class Qwen3MoeDemo(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.model.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.layers)])
        self.model.norm = RMSNorm(cfg.hidden, cfg.eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.rope = {}

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        out_std = 0.02 / math.sqrt(2 * self.cfg.layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                nn.init.ones_(p)
                continue
            std = out_std if ("o_proj" in name or "experts_down" in name) else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def cos_sin(self, n, device):
        key = (n, str(device))
        if key not in self.rope:
            self.rope[key] = rope_cos_sin(self.cfg, n, device)
        return self.rope[key]

    def forward(self, ids):
        cos, sin = self.cos_sin(ids.shape[1], ids.device)
        x = self.model.embed_tokens(ids)
        aux = 0.0
        for layer in self.model.layers:
            x, a = layer(x, cos, sin)
            aux = aux + a
        x = self.model.norm(x)
        return self.lm_head(x), aux / len(self.model.layers)


def hf_state_dict(model):
    """Published names, bf16, per-expert weights (a bf16 copy: the training model is not touched)."""
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().to("cpu", torch.bfloat16).contiguous()
        m = re.match(r"^(model\.layers\.\d+\.mlp\.)experts_(gate|up|down)$", name)
        if m:
            for e in range(t.shape[0]):
                out[f"{m.group(1)}experts.{e}.{m.group(2)}_proj.weight"] = t[e].clone().contiguous()
        else:
            out[name] = t
    return out


def load_hf_state_dict(model, tensors):
    sd = {}
    cfg = model.cfg
    for name in model.state_dict():
        m = re.match(r"^(model\.layers\.\d+\.mlp\.)experts_(gate|up|down)$", name)
        if m:
            sd[name] = torch.stack([tensors[f"{m.group(1)}experts.{e}.{m.group(2)}_proj.weight"]
                                    for e in range(cfg.experts)])
        else:
            sd[name] = tensors[name]
    model.load_state_dict({k: v.float() for k, v in sd.items()})


# ---------------------------------------------------------------------------------------------------------
# safetensors (the format is small; written here so the CPU smoke test needs no extra package)


def write_safetensors(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        assert t.dtype == torch.bfloat16 and t.is_contiguous(), name
        b = t.view(torch.int16).numpy().astype("<i2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = bytearray(blob[8 + n + a:8 + n + b])
        if t["dtype"] == "BF16":
            x = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16)
        elif t["dtype"] == "F32":
            x = torch.frombuffer(raw, dtype=torch.float32)
        else:
            raise SystemExit(f"train_demo.py: {path}: {name}: dtype {t['dtype']} not handled")
        out[name] = x.reshape(t["shape"]).clone()
    return out


# ---------------------------------------------------------------------------------------------------------
# Training


class Trainer:
    def __init__(self, args, model, device):
        self.args, self.model, self.device = args, model, device
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        try:
            self.opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                         fused=device.type == "cuda")
        except (TypeError, RuntimeError):
            self.opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
        self.fwd = model
        if args.compile and hasattr(torch, "compile"):
            self.fwd = torch.compile(model)
        self.amp = device.type == "cuda" and args.amp == "bf16"

    def autocast(self):
        if self.amp:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return torch.autocast(device_type="cpu", enabled=False)

    def step(self, inputs, targets, mask, lr):
        for g in self.opt.param_groups:
            g["lr"] = lr
        with self.autocast():
            logits, aux = self.fwd(inputs)
        loss_tok = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1),
                                   reduction="none")
        if mask is None:
            loss = loss_tok.mean()
        else:
            m = mask.reshape(-1).float()
            loss = (loss_tok * m).sum() / m.sum().clamp(min=1.0)
        total = loss + self.args.aux_coef * aux
        self.opt.zero_grad(set_to_none=True)
        total.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss, aux, gnorm


def lr_at(frac, step, peak, warmup, floor=0.1):
    """Linear warm-up over `warmup` steps, then cosine from peak to floor*peak as `frac` (time used) goes 0->1."""
    w = min(1.0, (step + 1) / max(1, warmup))
    c = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, max(0.0, frac))))
    return peak * w * c


@torch.no_grad()
def evaluate(model, rows, masks, batch, device, amp, half_from=None):
    """Mean loss over target positions (masked rows: where mask is 1); also over positions >= half_from."""
    model.eval()
    tot = cnt = tot_h = cnt_h = 0.0
    for i in range(0, len(rows), batch):
        r = torch.as_tensor(rows[i:i + batch], dtype=torch.long, device=device)
        with (torch.autocast(device_type="cuda", dtype=torch.bfloat16) if amp
              else torch.autocast(device_type="cpu", enabled=False)):
            logits, _ = model(r[:, :-1])
        lt = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), r[:, 1:].reshape(-1),
                             reduction="none").view(r.shape[0], -1)
        m = (torch.ones_like(lt) if masks is None
             else torch.as_tensor(masks[i:i + batch, 1:], device=device).float())
        tot += float((lt * m).sum())
        cnt += float(m.sum())
        if half_from is not None:
            tot_h += float((lt[:, half_from:] * m[:, half_from:]).sum())
            cnt_h += float(m[:, half_from:].sum())
    model.train()
    out = {"loss": tot / max(cnt, 1), "tokens": int(cnt)}
    out["ppl"] = math.exp(min(out["loss"], 50))
    if half_from is not None:
        out["loss_second_half"] = tot_h / max(cnt_h, 1)
        out["ppl_second_half"] = math.exp(min(out["loss_second_half"], 50))
    return out


@torch.no_grad()
def generate(model, tok, prompt_ids, max_new, stop_ids, device, amp, ctx):
    model.eval()
    ids = list(prompt_ids)
    for _ in range(max_new):
        x = torch.tensor([ids[-ctx:]], dtype=torch.long, device=device)
        with (torch.autocast(device_type="cuda", dtype=torch.bfloat16) if amp
              else torch.autocast(device_type="cpu", enabled=False)):
            logits, _ = model(x)
        nxt = int(logits[0, -1].float().argmax())
        ids.append(nxt)
        if nxt in stop_ids:
            break
    model.train()
    return tok.decode(ids[len(prompt_ids):])


def sample_prompts():
    def chat(*users, think=False):
        turns = [(u, None) for u in users]
        text = ""
        for u, _ in turns:
            text += f"{IM_START}user\n{u}{IM_END}\n"
        return text + f"{IM_START}assistant\n" + ("" if think else THINK_EMPTY)
    return [
        ("chat", chat("What does the word \"light\" mean?")),
        ("chat", chat("Quote Genesis 1:3.")),
        ("chat", chat("Tell me a fortune.")),
        ("chat", chat("What does os.getcwd() do in Python?")),
        ("chat", chat("What does printf() do?")),
        ("chat", chat("Who are you?")),
        ("chat", chat("What is 7 plus 5?")),
        ("chat, thinking on", chat("Define the word apple.", think=True)),
        ("text", "In the beginning God created"),
        ("text", "Apple (noun):"),
        ("text", "The strlen() function"),
    ]


# ---------------------------------------------------------------------------------------------------------
# Export


def tokenizer_config(max_len):
    return {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None, "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False, "eos_token": IM_END, "errors": "replace",
        "model_max_length": max_len, "pad_token": EOT, "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": None,
    }


def model_card(cfg, report, manifest):
    lines = ["# Magnetar demo model", "",
             "A small Qwen3-MoE language model trained by `tools/train/train_demo.py` for `make demo`: "
             f"{cfg.n_params() / 1e6:.1f}M parameters, {cfg.layers} layers, hidden {cfg.hidden}, "
             f"{cfg.experts} experts (top-{cfg.top_k}, moe_intermediate_size {cfg.moe_inter}), vocab {cfg.vocab}, "
             f"context {cfg.max_pos}. It knows a little English, the King James Bible, GCIDE definitions, "
             "Python and Linux documentation and fortune cookies, and is not to be trusted on anything.", "",
             "Training data: Debian packages (see docs/demo-corpus.md in the Magnetar repository).", ""]
    if manifest:
        lines.append("| package | version | licences named in its copyright file |")
        lines.append("| --- | --- | --- |")
        for pkg, p in manifest.get("packages", {}).items():
            lines.append(f"| {pkg} | {p['version']} | {', '.join(p['licences_named_in_copyright'])} |")
        lines.append("")
    ev = report.get("eval_final", {})
    if ev:
        lines.append(f"Held-out loss {ev.get('loss', float('nan')):.3f} (perplexity {ev.get('ppl', float('nan')):.1f}, "
                     f"all positions of {cfg.max_pos}-token windows).")
    return "\n".join(lines) + "\n"


def deterministic_tar(path, folder):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(f"magnetar-demo/{name}")
            info.size, info.mtime, info.mode, info.uid, info.gid = len(data), 0, 0o644, 0, 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    with open(path, "wb") as f:
        f.write(data)
    return data


def split_parts(data, out_dir, base, part_bytes):
    parts = []
    for i in range(0, max(1, len(data)), part_bytes):
        name = f"{base}.{len(parts):02d}"
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data[i:i + part_bytes])
        parts.append({"file": name, "bytes": len(data[i:i + part_bytes]),
                      "sha256": hashlib.sha256(data[i:i + part_bytes]).hexdigest()})
    return parts


def check_with_transformers(folder, own_fp32, tok, report):
    """Loads the folder with transformers and compares logits with our model (both float32, CPU)."""
    try:
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        report["transformers_check"] = "skipped: transformers not installed"
        return True
    kwargs = dict(dtype=torch.float32, attn_implementation="sdpa", output_loading_info=True)
    try:  # as tools/reference/make_fixtures.py loads its fixtures: the plain per-expert loop on the CPU
        res = AutoModelForCausalLM.from_pretrained(folder, experts_implementation="eager", **kwargs)
    except Exception:  # noqa: BLE001 (a transformers that refuses the option)
        res = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    hf, info = res if isinstance(res, tuple) else (res, {})
    bad_keys = {k: sorted(info.get(k) or [])[:6] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")
                if info.get(k)}
    hf.eval()
    text = "In the beginning God created the heaven and the earth.\nApple (noun): The fleshy pome."
    ids = torch.tensor([tok.encode(text)[:64]])
    with torch.no_grad():
        ref = hf(ids).logits[0].float()
        ours = own_fp32(ids)[0][0].float()
    rel = float((ref - ours).abs().max() / ref.abs().max())
    top1 = float((ref.argmax(-1) == ours.argmax(-1)).float().mean())
    ok = rel < 1e-3 and top1 == 1.0 and not bad_keys
    report["transformers_check"] = {"version": transformers.__version__, "tokens": int(ids.shape[1]),
                                    "max_rel_diff": rel, "top1_agreement": top1, "loading_problems": bad_keys,
                                    "ok": ok}
    # The chat template: transformers' rendering against ours.
    try:
        from transformers import AutoTokenizer
        at = AutoTokenizer.from_pretrained(folder)
        msgs = [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi."},
                {"role": "user", "content": "Define apple."}]
        got = at.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        want = (f"{IM_START}user\nHello!{IM_END}\n{IM_START}assistant\nHi.{IM_END}\n{IM_START}user\n"
                f"Define apple.{IM_END}\n{IM_START}assistant\n{THINK_EMPTY}")
        report["chat_template_check"] = {"ok": got == want, "got": got if got != want else "as expected"}
        ids_hf = at(want, add_special_tokens=False)["input_ids"]
        report["autotokenizer_ids_match"] = ids_hf == tok.encode(want)
    except Exception as e:  # noqa: BLE001 (a report, not a failure of the model)
        report["chat_template_check"] = f"error: {type(e).__name__}: {e}"
    return ok


def check_with_numpy_reference(folder, own_fp32, tok, report):
    """tools/reference/check_fixture.py's independent float64 numpy forward of the written folder."""
    ref_dir = os.path.join(REPO, "tools", "reference")
    if not os.path.exists(os.path.join(ref_dir, "check_fixture.py")):
        report["numpy_check"] = "skipped: tools/reference/check_fixture.py not found"
        return True
    sys.path.insert(0, ref_dir)
    import check_fixture
    m = check_fixture.Model(folder)
    ids = tok.encode("And God said, Let there be light: and there was light.")[:24]
    ref = m.forward(ids)
    with torch.no_grad():
        ours = own_fp32(torch.tensor([ids]))[0][0].double().numpy()
    rel = float(np.abs(ref - ours).max() / np.abs(ref).max())
    top1 = float((ref.argmax(1) == ours.argmax(1)).mean())
    ok = rel < 1e-3 and top1 == 1.0
    report["numpy_check"] = {"tokens": len(ids), "max_rel_diff": rel, "top1_agreement": top1, "ok": ok}
    return ok


# ---------------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--data", default=os.path.join(REPO, "build", "corpus"), help="make_corpus.py's output")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(REPO, "build", "demo-out"),
                    help="where the tar parts, report.json and train.log go")
    ap.add_argument("--work", default="/tmp/magnetar-demo", help="scratch: the HF folder, the whole tar")
    ap.add_argument("--init-from", default=None, help="HF folder written by this script: continue from it")
    ap.add_argument("--smoke", action="store_true", help="tiny model, slice of the data, seconds: a pipeline check")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--amp", default="bf16", choices=["bf16", "none"], help="autocast on CUDA")
    ap.add_argument("--compile", action="store_true", help="torch.compile the training forward")
    ap.add_argument("--seed", type=int, default=1234)
    # Model
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--moe-inter", type=int, default=256)
    ap.add_argument("--rope-theta", type=float, default=1e6)
    ap.add_argument("--seq-len", type=int, default=512)
    # Pretraining
    ap.add_argument("--minutes", type=float, default=5.0, help="pretraining wall-clock budget")
    ap.add_argument("--batch", type=int, default=128, help="sequences per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--aux-coef", type=float, default=0.01, help="router load-balancing loss weight")
    ap.add_argument("--eval-every", type=float, default=60.0, help="seconds of training between held-out evals")
    # Chat
    ap.add_argument("--chat-epochs", type=float, default=3.0)
    ap.add_argument("--chat-minutes", type=float, default=1.5, help="cap on the chat phase")
    ap.add_argument("--chat-lr", type=float, default=6e-4)
    ap.add_argument("--chat-mix", type=float, default=0.2, help="share of pretraining rows in chat batches")
    # Limits
    ap.add_argument("--deadline-minutes", type=float, default=9.2,
                    help="from --t0: training phases stop early so that export ends before this")
    ap.add_argument("--t0", type=float, default=None,
                    help="epoch seconds the device command started (default: now); e.g. --t0 $(date +%%s)")
    ap.add_argument("--part-mib", type=int, default=15, help="size of each tar part")
    ap.add_argument("--max-docs", type=int, default=0, help="use only the first N documents (testing)")
    ap.add_argument("--byte-tokenizer", action="store_true", help="bytes instead of BPE (testing only)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.hidden, args.layers, args.heads, args.kv_heads, args.head_dim = 64, 2, 2, 1, 32
        args.experts, args.top_k, args.moe_inter, args.seq_len, args.batch = 8, 2, 32, 128, 16
        args.minutes, args.chat_minutes, args.chat_epochs, args.warmup = 0.15, 0.1, 1.0, 10
        args.eval_every = 3.0
        args.max_docs = args.max_docs or 3000
        args.vocab = min(args.vocab, 1024)
    return args


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    log.open(os.path.join(args.out, "train.log"))
    deadline = (args.t0 or T0) + args.deadline_minutes * 60
    if args.t0 and time.time() - args.t0 > 60:
        log(f"started {time.time() - args.t0:.0f}s after --t0: {(deadline - time.time()) / 60:.1f} min left")
    if args.init_from:  # the folder's geometry wins over the model flags; its context is the row length
        with open(os.path.join(args.init_from, "config.json")) as f:
            args.seq_len = json.load(f)["max_position_embeddings"]
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    report = {"args": vars(args), "torch": torch.__version__, "timings_s": {}}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(0)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    log(f"train_demo.py: torch {torch.__version__}, device {device}"
        + (f" ({report['gpu']})" if device.type == "cuda" else "") + f", out {args.out}")

    def mark(name, t):
        report["timings_s"][name] = round(time.time() - t, 2)

    # 1. Data
    t = time.time()
    chat_only = bool(args.init_from) and args.minutes == 0
    train_text = read_member(args.data, "pretrain.tar.gz", "train.txt", required=not chat_only)
    if train_text is None:  # a chat-only continuation carrying only chat.tar.gz (tools/train/README.md)
        log("data: no pretrain.tar.gz: chat phase only, without pretraining rows or held-out text")
        args.chat_mix = 0.0
        train_docs, held_docs = [], []
    else:
        train_docs = split_docs(train_text)
        held_docs = split_docs(read_member(args.data, "pretrain.tar.gz", "heldout.txt"))
    del train_text
    chat_pairs = read_pairs(read_member(args.data, "chat.tar.gz", "chat.jsonl"))
    chat_held = read_pairs(read_member(args.data, "chat.tar.gz", "chat_heldout.jsonl"))
    try:
        manifest = json.loads(read_member(args.data, "chat.tar.gz", "manifest.json"))
    except (KeyError, SystemExit):
        manifest = {}
    if args.max_docs:
        train_docs, held_docs = train_docs[:args.max_docs], held_docs[:max(5, args.max_docs // 50)]
        chat_pairs, chat_held = chat_pairs[:args.max_docs], chat_held[:min(200, args.max_docs)]
    log(f"data: {len(train_docs)} train / {len(held_docs)} held-out documents "
        f"({sum(map(len, train_docs)) / 1e6:.1f} / {sum(map(len, held_docs)) / 1e6:.2f} M chars), "
        f"{len(chat_pairs)} / {len(chat_held)} chat pairs")
    mark("data", t)

    # 2. Tokenizer
    t = time.time()
    if args.init_from and os.path.exists(os.path.join(args.init_from, "tokenizer.json")):
        tok = HFTokenizer.load(os.path.join(args.init_from, "tokenizer.json"))
    elif args.init_from and not (args.smoke or args.byte_tokenizer):
        raise SystemExit(f"train_demo.py: {args.init_from}/tokenizer.json missing")
    elif has_tokenizers() and not args.init_from and not args.byte_tokenizer:
        texts = train_docs + [u + "\n" + a for u, a in chat_pairs]
        tok = HFTokenizer.train(iter(texts), args.vocab, len(texts))
    elif args.smoke or args.byte_tokenizer:
        log("tokenizer: no `tokenizers` (or a test model without tokenizer.json): byte-level stand-in")
        tok = ByteTokenizer()
    else:
        raise SystemExit("train_demo.py: the `tokenizers` package is needed (pip install tokenizers)")
    report["tokenizer"] = tok.check()
    eot, im_end = tok.id(EOT), tok.id(IM_END)
    vocab = max(args.vocab, tok.n) if not args.init_from else None
    log(f"tokenizer: {report['tokenizer']}")
    mark("tokenizer", t)

    t = time.time()
    train_stream = encode_stream(tok, train_docs, eot)
    held_stream = encode_stream(tok, held_docs, eot)
    n_chars = sum(map(len, train_docs))
    report["train_tokens"], report["heldout_tokens"] = int(len(train_stream)), int(len(held_stream))
    report["chars_per_token"] = round(n_chars / max(1, len(train_stream)), 3)
    log(f"encoded: {len(train_stream):,} train tokens ({report['chars_per_token']} chars/token), "
        f"{len(held_stream):,} held-out tokens")
    rng = random.Random(args.seed)
    convs = build_conversations(chat_pairs, rng)
    chat_samples = encode_conversations(tok, convs)
    row_len = args.seq_len + 1
    chat_rows, chat_masks, dropped = pack_rows(chat_samples, row_len, eot)
    held_convs = build_conversations(chat_held, random.Random(args.seed + 1), multi_turn=False)
    hc_rows, hc_masks, _ = pack_rows(encode_conversations(tok, held_convs), row_len, eot)
    # Segment-by-segment ids must equal the whole rendered string's ids (what an engine sees).
    mism = 0
    for (system, turns), (ids, _) in list(zip(convs, chat_samples))[:300]:
        if tok.encode("".join(s for s, _ in conversation_segments(system, turns))) != ids:
            mism += 1
    report["chat_segment_encoding_mismatches_of_300"] = mism
    log(f"chat: {len(convs)} conversations -> {len(chat_rows)} rows of {row_len} "
        f"({int(chat_masks.sum()):,} assistant tokens, {dropped} too long dropped); held-out {len(hc_rows)} rows; "
        f"segment-encoding mismatches {mism}/300")
    n_held_rows = (len(held_stream) - 1) // args.seq_len
    held_rows = np.stack([held_stream[i * args.seq_len:i * args.seq_len + row_len] for i in range(n_held_rows)]
                         or [np.full(row_len, eot, np.int32)])
    mark("encode", t)

    # 3. Model
    if args.init_from:
        with open(os.path.join(args.init_from, "config.json")) as f:
            cfg = Config.from_hf(json.load(f))
        model = Qwen3MoeDemo(cfg)
        load_hf_state_dict(model, read_safetensors(os.path.join(args.init_from, "model.safetensors")))
        log(f"model: loaded from {args.init_from}")
    else:
        cfg = Config(vocab=vocab, hidden=args.hidden, layers=args.layers, heads=args.heads,
                     kv_heads=args.kv_heads, head_dim=args.head_dim, experts=args.experts, top_k=args.top_k,
                     moe_inter=args.moe_inter, rope_theta=args.rope_theta, max_pos=args.seq_len)
        model = Qwen3MoeDemo(cfg)
        model.init_weights(args.seed)
    cfg.check()
    if tok.n > cfg.vocab:
        raise SystemExit(f"train_demo.py: tokenizer has {tok.n} tokens, model vocab {cfg.vocab}")
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == cfg.n_params(), (n_params, cfg.n_params())
    active = n_params - cfg.layers * (cfg.experts - cfg.top_k) * 3 * cfg.hidden * cfg.moe_inter
    report["params"], report["active_params"] = n_params, active
    report["config"] = cfg.hf(eot, im_end)
    log(f"model: {n_params / 1e6:.2f}M parameters ({active / 1e6:.2f}M active per token), "
        f"hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads}/{cfg.kv_heads} heads x {cfg.head_dim}, "
        f"{cfg.experts} experts top-{cfg.top_k} x {cfg.moe_inter}, vocab {cfg.vocab}")
    trainer = Trainer(args, model, device)
    amp = trainer.amp
    tokens_gpu = torch.as_tensor(train_stream, dtype=torch.long, device=device)
    ar = torch.arange(row_len, device=device)
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def pretrain_batch(n):
        assert len(tokens_gpu) > row_len, "no pretraining text"
        starts = torch.randint(0, len(tokens_gpu) - row_len, (n,), device=device, generator=gen)
        return tokens_gpu[starts[:, None] + ar]

    def eval_all(tag):
        te = time.time()
        if held_docs:
            ev = evaluate(model, held_rows, None, args.batch, device, amp, half_from=args.seq_len // 2)
            text = (f"held-out loss {ev['loss']:.4f} (ppl {ev['ppl']:.2f}; second halves "
                    f"{ev['loss_second_half']:.4f})")
        else:
            ev, text = {}, "no held-out text"
        ev["chat"] = evaluate(model, hc_rows, hc_masks, args.batch, device, amp)["loss"] if len(hc_rows) else None
        log(f"eval {tag}: {text}, held-out chat loss "
            f"{ev['chat'] if ev['chat'] is None else round(ev['chat'], 4)} [{time.time() - te:.1f}s]")
        return ev

    folder = os.path.join(args.work, "magnetar-demo")

    def write_report():
        with open(os.path.join(args.out, "report.json"), "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")

    def export(stage):
        """The HF folder, its tar and the tar's parts in OUT, then report.json (whose sha256 vouches for the
        parts): after pretraining as a checkpoint (a killed call still returns it) and at the end."""
        os.makedirs(folder, exist_ok=True)
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        tensors = hf_state_dict(model)
        write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(cfg.hf(eot, im_end), f, indent=2)
            f.write("\n")
        with open(os.path.join(folder, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": eot, "do_sample": True, "eos_token_id": [im_end, eot], "pad_token_id": eot,
                       "temperature": 0.7, "top_k": 20, "top_p": 0.8}, f, indent=2)
            f.write("\n")
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump(tokenizer_config(cfg.max_pos), f, indent=2)
            f.write("\n")
        tok.save(folder)
        with open(os.path.join(folder, "README.md"), "w") as f:
            f.write(model_card(cfg, report, manifest))
        report.pop("tar", None)
        write_report()  # no "tar" entry while the parts are being rewritten
        data = deterministic_tar(os.path.join(args.work, "demo-hf.tar"), folder)
        for old in os.listdir(args.out):
            if old.startswith("demo-hf.tar."):
                os.remove(os.path.join(args.out, old))
        report["tar"] = {"stage": stage, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                         "parts": split_parts(data, args.out, "demo-hf.tar", args.part_mib << 20),
                         "join": "cat demo-hf.tar.?? > demo-hf.tar && tar -xf demo-hf.tar  # -> magnetar-demo/"}
        write_report()
        log(f"export ({stage}): {folder} ({len(data) / 1e6:.1f} MB tar, {len(report['tar']['parts'])} parts "
            f"in {args.out})")
        return tensors

    report["eval_start"] = eval_all("start")

    # 4. Pretraining (wall-clock cosine)
    t = time.time()
    chat_reserve = args.chat_minutes * 60 + (20 if args.smoke else 75)
    budget = max(0.0, min(args.minutes * 60, deadline - chat_reserve - time.time()))
    step, tokens_seen, t_train, next_eval, history = 0, 0, 0.0, args.eval_every, []
    if budget > 0:
        log(f"pretrain: {budget:.0f}s budget, batch {args.batch} x {args.seq_len} = "
            f"{args.batch * args.seq_len:,} tokens/step, lr {args.lr}, warm-up {args.warmup} steps")
    while t_train < budget:
        ts = time.time()
        row = pretrain_batch(args.batch)
        lr = lr_at(t_train / budget, step, args.lr, args.warmup)
        loss, aux, gnorm = trainer.step(row[:, :-1], row[:, 1:], None, lr)
        if step % 50 == 0 or step < 3:
            loss_v = float(loss)  # synchronises
            if device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = t_train + time.time() - ts
            log(f"pretrain step {step}: loss {loss_v:.4f} aux {float(aux):.3f} |g| {float(gnorm):.2f} "
                f"lr {lr:.2e} ({tokens_seen / max(elapsed, 1e-9) / 1e3:.0f}k tok/s)")
            history.append({"step": step, "t": round(elapsed, 1), "loss": round(loss_v, 4)})
            if not math.isfinite(loss_v):
                raise SystemExit("train_demo.py: loss is not finite")
        if device.type == "cuda" and step % 10 == 0:
            torch.cuda.synchronize()
        t_train += time.time() - ts
        step += 1
        tokens_seen += args.batch * args.seq_len
        if step == 1:
            t_train = 0.0  # the first step pays for allocation (and compilation): not budgeted
            tokens_seen = 0
            log(f"pretrain: first step took {time.time() - ts:.1f}s")
        if t_train >= next_eval and t_train < budget:
            history[-1]["eval"] = eval_all(f"pretrain {t_train:.0f}s")
            next_eval += args.eval_every
    if step:
        report["pretrain"] = {"steps": step, "seconds": round(t_train, 1), "tokens": tokens_seen + args.batch *
                              args.seq_len, "tokens_per_s": round(tokens_seen / max(t_train, 1e-9)),
                              "epochs": round((tokens_seen + args.batch * args.seq_len) / max(1, len(train_stream)), 2),
                              "history": history}
        log(f"pretrain: {step} steps, {report['pretrain']['tokens']:,} tokens "
            f"({report['pretrain']['epochs']} epochs) in {t_train:.0f}s, {report['pretrain']['tokens_per_s']:,} tok/s")
        report["eval_pretrain"] = eval_all("after pretraining")
        export("pretrained")
    mark("pretrain", t)

    # 5. Chat phase
    t = time.time()
    n_chat = max(1, int(round(args.batch * (1 - args.chat_mix))))
    steps_goal = int(math.ceil(args.chat_epochs * len(chat_rows) / n_chat))
    cap = max(0.0, min(args.chat_minutes * 60, deadline - (15 if args.smoke else 50) - time.time()))
    chat_rows_gpu = torch.as_tensor(chat_rows, dtype=torch.long, device=device)
    chat_masks_gpu = torch.as_tensor(chat_masks, dtype=torch.uint8, device=device)
    log(f"chat: {steps_goal} steps goal ({args.chat_epochs} epochs of {len(chat_rows)} rows, {n_chat} chat + "
        f"{args.batch - n_chat} pretraining rows per step), cap {cap:.0f}s, lr {args.chat_lr}")
    cstep, t_chat, perm, pos = 0, 0.0, torch.randperm(len(chat_rows), device=device, generator=gen), 0
    warm = min(30, max(1, steps_goal // 10))
    while cstep < steps_goal and t_chat < cap:
        ts = time.time()
        if pos + n_chat > len(perm):
            perm, pos = torch.randperm(len(chat_rows), device=device, generator=gen), 0
        idx = perm[pos:pos + n_chat]
        pos += n_chat
        rows = chat_rows_gpu[idx]
        masks = chat_masks_gpu[idx]
        if args.batch > n_chat:
            pr = pretrain_batch(args.batch - n_chat)
            rows = torch.cat([rows, pr])
            masks = torch.cat([masks, torch.ones_like(pr, dtype=torch.uint8)])
        frac = max(cstep / steps_goal, t_chat / cap if cap else 1.0)
        lr = lr_at(frac, cstep, args.chat_lr, warm, floor=0.05)
        loss, aux, gnorm = trainer.step(rows[:, :-1], rows[:, 1:], masks[:, 1:], lr)
        if cstep % 50 == 0:
            log(f"chat step {cstep}: loss {float(loss):.4f} aux {float(aux):.3f} lr {lr:.2e}")
        if device.type == "cuda" and cstep % 10 == 0:
            torch.cuda.synchronize()
        t_chat += time.time() - ts
        cstep += 1
    report["chat"] = {"steps": cstep, "steps_goal": steps_goal, "seconds": round(t_chat, 1),
                      "rows": int(len(chat_rows)), "epochs": round(cstep * n_chat / max(1, len(chat_rows)), 2)}
    log(f"chat: {cstep} steps in {t_chat:.0f}s ({report['chat']['epochs']} epochs)")
    mark("chat", t)

    # 6. Eval and expert usage
    t = time.time()
    for layer in model.model.layers:
        layer.mlp.usage = torch.zeros(cfg.experts, device=device)
    report["eval_final"] = eval_all("final")
    usage = []
    for layer in model.model.layers:
        u = layer.mlp.usage / layer.mlp.usage.sum()
        usage.append([round(float(x), 4) for x in u])
        layer.mlp.usage = None
    report["expert_share_per_layer"] = usage
    log("expert share per layer (min / max of 1/E = %.3f): " % (1 / cfg.experts)
        + ", ".join(f"{min(u):.3f}/{max(u):.3f}" for u in usage))
    mark("eval", t)

    # 7. Export (before the optional checks, so a late kill still leaves the model)
    t = time.time()
    tensors = export("final")
    mark("export", t)

    # 8. Checks and samples (skipped when out of time)
    ok = True
    if time.time() < deadline:
        t = time.time()
        own = Qwen3MoeDemo(cfg)
        load_hf_state_dict(own, tensors)  # the bf16 weights as written, in float32
        own.eval()
        for name, fn in (("numpy reference", check_with_numpy_reference), ("transformers", check_with_transformers)):
            try:
                good = fn(folder, own, tok, report)
            except Exception as e:  # noqa: BLE001 (reported, and the exit status says so)
                report[name.split()[0] + "_check_error"] = f"{type(e).__name__}: {e}"
                good = False
            ok = ok and good
            log(f"check {name}: {'ok' if good else 'FAILED'}")
        log(f"checks: {json.dumps({k: report.get(k) for k in ('numpy_check', 'transformers_check', 'chat_template_check', 'autotokenizer_ids_match')})}")
        mark("checks", t)
        write_report()
    if time.time() < deadline:
        t = time.time()
        stops = {im_end, eot}
        samples = []
        for kind, prompt in sample_prompts():
            out = generate(model, tok, tok.encode(prompt), 60 if args.smoke else 96, stops, device, amp, cfg.max_pos)
            samples.append({"kind": kind, "prompt": prompt, "output": out})
            log(f"sample ({kind}): {prompt[-60:]!r} -> {out!r}")
        report["samples"] = samples
        mark("samples", t)
    report["total_s"] = round(time.time() - T0, 1)
    report["ok"] = ok
    write_report()
    log(f"done in {report['total_s']}s; {'all checks passed' if ok else 'SOME CHECKS FAILED (report.json)'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
