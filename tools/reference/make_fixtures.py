#!/usr/bin/env python3
"""Tiny random-weight Qwen3-MoE and Qwen3 models, as Hugging Face folders, with reference logits from transformers.

Writes, for each model in SPECS, OUT/NAME/ holding
  config.json                      published-checkpoint style (num_experts, head_dim, rope_theta, ...), written
                                   by hand, not by transformers 5.x (which would write num_local_experts etc.)
  model.safetensors                bf16 tensors, published names (per-expert gate/up/down_proj), saved with
  (or model-0000N-of-00002...      safetensors' save_file; the dense model is sharded in two with
   + model.safetensors.index.json) model.safetensors.index.json so the sharded path is exercised
  reference/tokens.json            the token sequences and how the logits were made
  reference/logits_lenN.npy        float32 [n_tokens, n_vocab], every position, teacher-forced

Weights are drawn in numpy (one seeded generator per tensor name, so they never depend on draw order),
rounded to bf16 in numpy, and written as bf16. The reference model is then LOADED FROM THE WRITTEN FOLDER by
transformers (AutoModelForCausalLM.from_pretrained, float64, on the CPU, TF32 off), so the truth is computed
from exactly the files that are shipped, through transformers' own per-expert -> fused conversion. Nothing casts
the module to bf16 (that would also round buffers such as RoPE's inv_freq).

Checks done here (printed; any failure makes the exit status 1, after the tar is written so it can be read):
  - no missing / unexpected / mismatched keys when transformers loads the folder
  - every parameter transformers holds equals the bf16 value written (experts compared after fusing)
  - the transformers behaviours the engine relies on: sliding window off, which layers are dense, head_dim,
    norm_topk_prob, rope theta (inv_freq), and what transformers 5.x itself would write into a config.json
  - float32 (TF32 off) vs float64 reference distance, and token-by-token decode (KV cache) vs prefill
  - every reference position has a clear top-1 (the token sequences are selected for it: make_sequences)
Run tools/reference/check_fixture.py afterwards: an independent numpy float64 forward of the same files.
tests/fixtures/README.md has the exact commands and what came out.

Usage:
  make_fixtures.py --out DIR [--tar FILE.tar]   (needs torch, transformers, safetensors, numpy)
  make_fixtures.py --out DIR --dry-run          (numpy only: weights, config and tokens, no reference logits;
                                                 writes safetensors with a minimal writer, for local testing)
"""
import argparse
import dataclasses
import json
import os
import re
import struct
import sys
import tarfile
import tempfile
import traceback
import zlib

import numpy as np

SEQ_LENGTHS = (1, 7, 64, 100)
TOP1_MARGIN = 0.15  # every reference position: top-1 logit - top-2 logit >= this (see make_sequences)
ROUTE_MARGIN = 0.1  # and in every MoE layer: k-th router logit - (k+1)-th >= this


@dataclasses.dataclass
class Spec:
    name: str
    model_type: str  # "qwen3_moe" or "qwen3"
    seed: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int  # dense FFN width (dense layers of the MoE models, every layer of qwen3)
    rope_theta: float
    write_head_dim: bool = True  # False: config.json omits head_dim (readers must use hidden / heads)
    tie: bool = False
    shards: int = 1
    n_experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    mlp_only_layers: list | None = None  # None: the key is omitted from config.json
    decoder_sparse_step: int = 1
    norm_topk_prob: bool = True

    def is_moe(self, il):
        return (self.n_experts > 0 and il not in (self.mlp_only_layers or [])
                and (il + 1) % self.decoder_sparse_step == 0)


SPECS = [
    # The main fixture: one dense layer (mlp_only_layers=[1]) among three MoE layers.
    Spec(name="qwen3_moe", model_type="qwen3_moe", seed=31001, hidden=128, layers=4, heads=4, kv_heads=2,
         head_dim=32, vocab=512, intermediate=256, rope_theta=1e6, n_experts=8, top_k=2, moe_intermediate=64,
         mlp_only_layers=[1], decoder_sparse_step=1, norm_topk_prob=True),
    # No head_dim and no mlp_only_layers in config.json; decoder_sparse_step=2 makes layer 0 dense and layer 1
    # MoE; one KV head (MQA); rope_theta 1e4.
    Spec(name="qwen3_moe_nohd", model_type="qwen3_moe", seed=31002, hidden=64, layers=2, heads=2, kv_heads=1,
         head_dim=32, write_head_dim=False, vocab=256, intermediate=128, rope_theta=1e4, n_experts=8, top_k=2,
         moe_intermediate=32, mlp_only_layers=None, decoder_sparse_step=2, norm_topk_prob=True),
    # Dense Qwen3 like the small published ones: tied embeddings, head_dim * heads (256) != hidden (128),
    # sharded into two safetensors files.
    Spec(name="qwen3", model_type="qwen3", seed=31003, hidden=128, layers=2, heads=4, kv_heads=2, head_dim=64,
         vocab=512, intermediate=256, rope_theta=1e6, tie=True, shards=2),
]

# ---------------------------------------------------------------------------------------------------------
# Config and weights


def hf_config(s):
    """config.json as the published Qwen3 / Qwen3-MoE checkpoints write it."""
    c = {
        "architectures": ["Qwen3MoeForCausalLM" if s.model_type == "qwen3_moe" else "Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "hidden_size": s.hidden,
        "initializer_range": 0.02,
        "intermediate_size": s.intermediate,
        "max_position_embeddings": 4096,
        "max_window_layers": s.layers,
        "model_type": s.model_type,
        "num_attention_heads": s.heads,
        "num_hidden_layers": s.layers,
        "num_key_value_heads": s.kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": s.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": s.tie,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": s.vocab,
    }
    if not s.write_head_dim:
        assert s.head_dim * s.heads == s.hidden
        del c["head_dim"]
    if s.model_type == "qwen3_moe":
        c.update({
            "decoder_sparse_step": s.decoder_sparse_step,
            "moe_intermediate_size": s.moe_intermediate,
            "norm_topk_prob": s.norm_topk_prob,
            "num_experts": s.n_experts,
            "num_experts_per_tok": s.top_k,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        })
        if s.mlp_only_layers is not None:
            c["mlp_only_layers"] = s.mlp_only_layers
    return dict(sorted(c.items()))


def tensor_plan(s):
    """[(name, shape, mean, std)] in published names; Linear weights are [out, in].

    Scales (chosen with check_fixture.py --q8, a simulated Q8_0 run, so that the engine's Q8_0 thresholds
    hold with margin; random networks amplify quantization noise far more than trained ones):
      - q/k/v/gate/up: N(0, 1/fan_in), so activations stay O(1);
      - o_proj and down_proj: N(0, (0.35)^2/fan_in): each layer adds a modest update to the residual;
      - LM head N(0, 1.2^2/hidden): logits have std ~1.2, max ~4-7; a tied embedding (the dense model, whose
        residual stream is all layer output and so twice as noisy under Q8_0) N(0, 1/hidden);
      - untied embedding N(0, 1): the residual stream keeps a clean token component;
      - router N(0, 4/hidden): router logits of std ~2, so routing is decisive;
      - every RMSNorm weight (input, post-attention, q/k, final) ~ 1 + N(0, 0.15^2): a norm applied wrongly
        or not at all shows.
    Simulated Q8_0 with these (tools/reference/check_fixture.py --q8): mean KL ~1e-4 (MoE) to ~4e-4 (dense),
    top-1 agreement 100%.
    """
    H, hd = s.hidden, s.head_dim
    out = 0.35  # scale of the matrices that write into the residual stream
    head = 1.2 / np.sqrt(H)
    plan = [("model.embed_tokens.weight", (s.vocab, H), 0.0, 1.0 / np.sqrt(H) if s.tie else 1.0)]
    for il in range(s.layers):
        p = f"model.layers.{il}."
        plan += [
            (p + "input_layernorm.weight", (H,), 1.0, 0.15),
            (p + "self_attn.q_proj.weight", (s.heads * hd, H), 0.0, 1 / np.sqrt(H)),
            (p + "self_attn.k_proj.weight", (s.kv_heads * hd, H), 0.0, 1 / np.sqrt(H)),
            (p + "self_attn.v_proj.weight", (s.kv_heads * hd, H), 0.0, 1 / np.sqrt(H)),
            (p + "self_attn.o_proj.weight", (H, s.heads * hd), 0.0, out / np.sqrt(s.heads * hd)),
            (p + "self_attn.q_norm.weight", (hd,), 1.0, 0.15),
            (p + "self_attn.k_norm.weight", (hd,), 1.0, 0.15),
            (p + "post_attention_layernorm.weight", (H,), 1.0, 0.15),
        ]
        if s.is_moe(il):
            I = s.moe_intermediate
            plan.append((p + "mlp.gate.weight", (s.n_experts, H), 0.0, 2 / np.sqrt(H)))
            for e in range(s.n_experts):
                q = f"{p}mlp.experts.{e}."
                plan += [(q + "gate_proj.weight", (I, H), 0.0, 1 / np.sqrt(H)),
                         (q + "up_proj.weight", (I, H), 0.0, 1 / np.sqrt(H)),
                         (q + "down_proj.weight", (H, I), 0.0, out / np.sqrt(I))]
        else:
            I = s.intermediate
            plan += [(p + "mlp.gate_proj.weight", (I, H), 0.0, 1 / np.sqrt(H)),
                     (p + "mlp.up_proj.weight", (I, H), 0.0, 1 / np.sqrt(H)),
                     (p + "mlp.down_proj.weight", (H, I), 0.0, out / np.sqrt(I))]
    plan.append(("model.norm.weight", (H,), 1.0, 0.15))
    if not s.tie:
        plan.append(("lm_head.weight", (s.vocab, H), 0.0, head))
    return plan


def bf16_bits(x):
    """float32 -> bf16 bit patterns (uint16), round to nearest even (no NaN/inf in our data)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def make_weights(s):
    """{name: bf16 bit patterns}; each tensor from its own generator seeded by (model seed, crc32(name))."""
    out = {}
    for name, shape, mean, std in tensor_plan(s):
        rng = np.random.default_rng([s.seed, zlib.crc32(name.encode())])
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)
        out[name] = bf16_bits(x)
    return out


def make_sequences(s, folder):
    """Random token sequences whose every position has a clear winner.

    Token i is drawn uniformly; if the logits at position i (computed by check_fixture.py's numpy forward of
    the written folder) have top-1 - top-2 < TOP1_MARGIN, or some MoE layer's router at position i nearly
    tied between its k-th and (k+1)-th expert (< ROUTE_MARGIN), it is drawn again (at most 50 times). With
    ~500 random logits about one position in four is a near tie, where Q8_0's noise (logit std ~0.02-0.04
    here) flips the argmax of a perfectly correct engine, and a near-tied router flips an expert; after this
    selection a top-1 disagreement means an error. The selection only picks the inputs: the reference logits
    still come from transformers.
    """
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import check_fixture
    model = check_fixture.Model(folder)
    rng = np.random.default_rng([s.seed, 7])
    seqs = []
    for n in SEQ_LENGTHS:
        tokens = []
        for _ in range(n):
            for _attempt in range(50):
                t = int(rng.integers(0, s.vocab))
                top = np.sort(model.forward(tokens + [t])[-1])[-2:]
                if top[1] - top[0] >= TOP1_MARGIN and model.route_gap[-1] >= ROUTE_MARGIN:
                    break
            tokens.append(t)
        seqs.append({"name": f"len{n}", "tokens": tokens, "logits": f"logits_len{n}.npy"})
    return seqs


def shard_names(s, names):
    """Split names (in plan order) into s.shards groups of about equal size, whole layers kept together."""
    if s.shards == 1:
        return {"model.safetensors": names}
    files = [f"model-{i + 1:05d}-of-{s.shards:05d}.safetensors" for i in range(s.shards)]
    groups = {f: [] for f in files}
    cut = s.layers // 2  # layers below `cut` (and the embedding) go to the first shard
    for n in names:
        first = n.startswith("model.embed_tokens") or (n.startswith("model.layers.")
                                                         and int(n.split(".")[2]) < cut)
        groups[files[0] if first else files[1]].append(n)
    return groups


def write_safetensors_minimal(path, tensors):
    """Dry-run only (no torch here): the same layout safetensors' save_file writes, bf16 tensors."""
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        b = tensors[name].astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def write_folder(s, folder, weights, dry_run):
    os.makedirs(os.path.join(folder, "reference"), exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf_config(s), f, indent=2)
        f.write("\n")
    groups = shard_names(s, [n for n, *_ in tensor_plan(s)])
    weight_map, total = {}, 0
    for fname, names in groups.items():
        part = {n: weights[n] for n in names}
        if dry_run:
            write_safetensors_minimal(os.path.join(folder, fname), part)
        else:
            import torch
            from safetensors.torch import save_file
            ts = {n: torch.from_numpy(bf16_to_f32(b)).to(torch.bfloat16).contiguous() for n, b in part.items()}
            for n, t in ts.items():  # float32 -> bf16 must be exact: the values are bf16 already
                assert np.array_equal(t.view(torch.int16).numpy().view(np.uint16), part[n]), n
            save_file(ts, os.path.join(folder, fname), metadata={"format": "pt"})
        for n in names:
            weight_map[n] = fname
            total += weights[n].size * 2
    if s.shards > 1:
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
            f.write("\n")


# ---------------------------------------------------------------------------------------------------------
# Reference logits through transformers


class Checks:
    def __init__(self):
        self.failures = []

    def expect(self, cond, what):
        print(f"    [{'ok' if cond else 'FAIL'}] {what}")
        if not cond:
            self.failures.append(what)


def guarded(checks, what, fn):
    """Runs a diagnostic; a crash is reported (and counted as a failed check when `checks` is given) but does
    not stop the run, so one unexpected transformers API change still leaves fixtures and a log to read."""
    try:
        fn()
    except Exception:  # noqa: BLE001
        traceback.print_exc(file=sys.stdout)
        if checks is not None:
            checks.expect(False, f"{what} crashed")
        else:
            print(f"    ({what} crashed; informational only)")


def load_model(folder, dtype):
    from transformers import AutoModelForCausalLM
    kwargs = dict(dtype=dtype, attn_implementation="sdpa", output_loading_info=True)
    try:  # the plain per-expert loop: no grouped_mm kernels on the CPU in float64
        res = AutoModelForCausalLM.from_pretrained(folder, experts_implementation="eager", **kwargs)
    except Exception as e:  # noqa: BLE001 (older/newer transformers, or a dense model refusing the option)
        print(f"    (from_pretrained with experts_implementation='eager' refused: {type(e).__name__}: {e})")
        res = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    model, info = res if isinstance(res, tuple) else (res, {})
    impl = getattr(model.config, "_experts_implementation", None)
    if impl not in (None, "eager"):
        try:
            model.config._experts_implementation = "eager"
        except Exception as e:  # noqa: BLE001
            print(f"    (could not set _experts_implementation: {e})")
    model.eval()
    return model, info


def expected_param(s, weights, name):
    """What transformers' parameter `name` must hold, as float64, from the written bf16 weights (or None)."""
    if name in weights:
        return bf16_to_f32(weights[name]).astype(np.float64)
    if name == "lm_head.weight" and s.tie:
        return bf16_to_f32(weights["model.embed_tokens.weight"]).astype(np.float64)
    for suffix, parts in (("experts.gate_up_proj", ("gate_proj", "up_proj")), ("experts.down_proj", ("down_proj",))):
        if name.endswith(suffix):
            p = name[: -len(suffix)] + "experts."
            return np.stack([np.concatenate([bf16_to_f32(weights[f"{p}{e}.{q}.weight"]) for q in parts], axis=0)
                             for e in range(s.n_experts)]).astype(np.float64)
    return None


def confirm_behaviour(s, model, weights, info, checks):
    import torch
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        bad = [k for k in (info.get(key) or []) if not (s.tie and k == "lm_head.weight")]
        checks.expect(not bad, f"loading info {key}: {sorted(bad)[:6]}")
    worst, unchecked = 0.0, []
    for name, t in model.state_dict().items():
        want = expected_param(s, weights, name)
        if want is None:
            unchecked.append(name)
            continue
        got = t.detach().to(torch.float64).numpy()
        if got.shape != want.shape and got.ndim == 3 and got.transpose(0, 2, 1).shape == want.shape:
            got = got.transpose(0, 2, 1)
        if got.shape != want.shape:
            checks.expect(False, f"parameter {name}: shape {got.shape} vs written {want.shape}")
            continue
        worst = max(worst, float(np.abs(got - want).max()))
    checks.expect(worst == 0.0, f"every loaded parameter equals the written bf16 value (max |d| {worst:g})")
    if unchecked:
        print(f"    (state-dict entries not compared: {unchecked[:8]})")
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    print(f"    parameter dtypes: {dtypes}")

    cfg = model.config
    layers = model.model.layers
    mlp_kinds = [type(layer.mlp).__name__ for layer in layers]
    print(f"    mlp per layer: {mlp_kinds}")
    want_moe = [s.is_moe(il) for il in range(s.layers)]
    got_moe = [hasattr(layer.mlp, "experts") for layer in layers]
    checks.expect(got_moe == want_moe, f"MoE layers {[i for i, m in enumerate(got_moe) if m]} as intended "
                  f"({[i for i, m in enumerate(want_moe) if m]})")
    attn = layers[0].self_attn
    checks.expect(attn.head_dim == s.head_dim, f"head_dim {attn.head_dim} == {s.head_dim} "
                  f"(config.json {'has' if s.write_head_dim else 'omits'} head_dim)")
    sw = [getattr(layer.self_attn, "sliding_window", None) for layer in layers]
    print(f"    config.sliding_window {getattr(cfg, 'sliding_window', None)!r}, use_sliding_window "
          f"{getattr(cfg, 'use_sliding_window', None)!r}, layer_types {getattr(cfg, 'layer_types', None)}")
    checks.expect(all(w is None for w in sw), f"no sliding window in any layer ({sw})")
    if s.n_experts:
        checks.expect(bool(cfg.norm_topk_prob) == s.norm_topk_prob, f"norm_topk_prob {cfg.norm_topk_prob}")
        checks.expect(cfg.num_experts == s.n_experts, f"num_experts {cfg.num_experts}")
        checks.expect(cfg.num_experts_per_tok == s.top_k, f"num_experts_per_tok {cfg.num_experts_per_tok}")
    rot = [m for n, m in model.named_modules() if n.endswith("rotary_emb")]
    inv = rot[0].inv_freq.detach().to(torch.float64).numpy()
    want_inv = s.rope_theta ** (-np.arange(0, s.head_dim, 2, dtype=np.float64) / s.head_dim)
    rel = float(np.abs(inv - want_inv).max() / want_inv.max())
    checks.expect(inv.shape == want_inv.shape and rel < 1e-6,
                  f"rope inv_freq from theta {s.rope_theta:g} (rel {rel:.1e}, buffer dtype {rot[0].inv_freq.dtype})")
    print(f"    rope_parameters: {getattr(cfg, 'rope_parameters', None)}")
    with tempfile.TemporaryDirectory() as tmp:
        cfg.save_pretrained(tmp)
        with open(os.path.join(tmp, "config.json")) as f:
            written = json.load(f)
    keys = {k: v for k, v in written.items() if any(w in k for w in ("expert", "head_dim", "rope", "sliding",
                                                                     "mlp_only", "sparse", "topk", "dtype"))}
    print(f"    transformers' own config.json would hold: {json.dumps(keys, sort_keys=True)}")


def reference(s, folder, weights, seqs, checks):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))

    dtype_name = "float64"
    try:
        model, info = load_model(folder, torch.float64)
        with torch.no_grad():
            model(input_ids=torch.tensor([[0, 1]]))
    except Exception as e:  # noqa: BLE001 (model code that refuses float64: fall back to float32, TF32 off)
        print(f"    float64 failed ({type(e).__name__}: {e}); reference in float32 on the CPU")
        dtype_name = "float32"
        model, info = load_model(folder, torch.float32)
    guarded(checks, "behaviour checks", lambda: confirm_behaviour(s, model, weights, info, checks))

    logits = {}
    with torch.no_grad():
        for q in seqs:
            ids = torch.tensor([q["tokens"]], dtype=torch.long)
            logits[q["name"]] = model(input_ids=ids, use_cache=False).logits[0].to(torch.float64).numpy()

    def decode_vs_prefill():  # token by token through transformers' KV cache must reproduce prefill
        q = seqs[-1]
        ids = torch.tensor([q["tokens"]], dtype=torch.long)
        pkv, rows = None, []
        with torch.no_grad():
            for i in range(ids.shape[1]):
                out = model(input_ids=ids[:, i:i + 1], past_key_values=pkv, use_cache=True)
                pkv = out.past_key_values
                rows.append(out.logits[0, -1].to(torch.float64).numpy())
        d = float(np.abs(np.stack(rows) - logits[q["name"]]).max())
        checks.expect(d < 1e-9 if dtype_name == "float64" else d < 1e-4,
                      f"transformers decode vs prefill ({q['name']}): max |d| {d:.2e}")

    def float32_distance():  # how far a float32 CPU reference (TF32 off) would be from this one
        m32, _ = load_model(folder, torch.float32)
        with torch.no_grad():
            d32 = max(float(np.abs(m32(input_ids=torch.tensor([q["tokens"]])).logits[0].double().numpy()
                                   - logits[q["name"]]).max()) for q in seqs)
        print(f"    float32 (TF32 off) vs float64 reference: max |d| {d32:.2e}")

    guarded(checks, "decode vs prefill", decode_vs_prefill)
    if dtype_name == "float64":
        guarded(None, "float32 distance", float32_distance)

    for q in seqs:
        z = logits[q["name"]]
        am = z.argmax(1)
        gap = np.diff(np.sort(z, axis=1)[:, -2:], axis=1)[:, 0]
        print(f"    {q['name']:>6}: logits std {z.std():.2f}, max |z| {np.abs(z).max():.2f}, "
              f"distinct argmax {len(set(am.tolist()))}/{len(am)}, top1-top2 gap min {gap.min():.3f} "
              f"median {np.median(gap):.3f}")
        checks.expect(gap.min() >= 0.99 * TOP1_MARGIN, f"{q['name']}: every position has a clear top-1")
    return logits, dtype_name


# ---------------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder to write the fixtures into (one subfolder per model)")
    ap.add_argument("--tar", help="also pack the whole --out folder into this tar file")
    ap.add_argument("--dry-run", action="store_true", help="numpy only: no reference logits")
    ap.add_argument("--only", nargs="*", help="model names to build (default: all)")
    args = ap.parse_args()

    versions = {"numpy": np.__version__, "python": sys.version.split()[0]}
    if not args.dry_run:
        import safetensors
        import torch
        import transformers
        versions.update(torch=torch.__version__, transformers=transformers.__version__,
                        safetensors=safetensors.__version__)
    print(f"versions: {versions}")

    checks = Checks()
    for s in SPECS:
        if args.only and s.name not in args.only:
            continue
        folder = os.path.join(args.out, s.name)
        weights = make_weights(s)
        n_params = sum(w.size for w in weights.values())
        print(f"== {s.name}: {n_params} parameters, {s.layers} layers, MoE layers "
              f"{[il for il in range(s.layers) if s.is_moe(il)]}, {s.shards} shard(s)")
        write_folder(s, folder, weights, args.dry_run)
        seqs = make_sequences(s, folder)
        meta = {
            "model": s.name,
            "how": "tools/reference/make_fixtures.py; logits from transformers on the CPU, TF32 off",
            "versions": versions,
            "reference_dtype": None,
            "top1_margin": TOP1_MARGIN,
            "route_margin": ROUTE_MARGIN,
            "sequences": seqs,
        }
        if not args.dry_run:
            try:
                logits, dtype_name = reference(s, folder, weights, seqs, checks)
                meta["reference_dtype"] = dtype_name
                for q in seqs:
                    np.save(os.path.join(folder, "reference", q["logits"]), logits[q["name"]].astype(np.float32))
            except Exception:  # noqa: BLE001 (keep going: the other models and the log still come back)
                traceback.print_exc(file=sys.stdout)
                checks.expect(False, f"{s.name}: reference logits crashed")
        text = json.dumps(meta, indent=1)  # token lists on one line each
        text = re.sub(r"\[([\d,\s]*)\]", lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]", text)
        with open(os.path.join(folder, "reference", "tokens.json"), "w") as f:
            f.write(text + "\n")

    if args.tar:
        with tarfile.open(args.tar, "w") as tar:
            for s in SPECS:
                if os.path.isdir(os.path.join(args.out, s.name)):
                    tar.add(os.path.join(args.out, s.name), arcname=s.name)
        print(f"packed {args.tar} ({os.path.getsize(args.tar)} bytes)")
    if checks.failures:
        print(f"make_fixtures: {len(checks.failures)} check(s) FAILED:")
        for f in checks.failures:
            print(f"  {f}")
        return 1
    print("make_fixtures: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
