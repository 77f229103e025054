"""An independent reference forward of DeepSeek-V4.1-Flash (tiny configs), written from V41_FACTS.md and the
model description — it shares no code with graphsim's graph or its executor (``graphsim.views.collect``),
and runs in NumPy (with ml_dtypes for the formats), so it compiles nothing: each new sequence length would cost
seconds of XLA compilation in eager JAX.

One request at a time, the whole token sequence 0..N-1 at once (no cache: a decode step is the last position
of the sequence that includes it), layer by layer as the model is described:

  embed -> 4 residual streams; per layer: [Engram] -> mHC pre (attention) -> low-rank Q, shared latent KV,
  RoPE -> [KV owner: CSA2 compressor (softmax-gated groups of m, or the plain m=1 projection) -> main KV
  (FP4) and index K (MXFP4)] -> [index source: index Q (MXFP4), head weights, scores Σ relu(q·k)·w over the
  visible entries — on the Decoder's candidate source also block max and the candidate pool, in the
  Decoder's Reindex layers scores on the pool only — and Top-K] -> SWA window + Top-K entries of the KV
  owner (Top-K of the latest producer for Reuse layers) with a per-head sink -> grouped wo_a, wo_b -> mHC
  post -> mHC pre (FFN) -> sqrt-softplus routed MoE + shared expert -> mHC post; head: mean of the streams,
  RMSNorm, LM head.

A request with an image (``forward(..., image=(pixels, grid))``): the ViT tower over the image's patches
(patch embed; per block RMSNorm, QKV, 2-D RoPE — a head's first half of channels by the patch row, the second
half by its column —, bidirectional attention, output projection, residual; RMSNorm, SwiGLU MLP, residual;
final RMSNorm), then the aligner (the grid zero-padded to multiples of r, each r×r block one image token of
r²·h features in (row, column, channel) order, fc1, tanh-GELU, fc2); its features replace the embeddings of
the first image-token positions, which bypass Engram.

The [reconstructed] choices (hashes, mHC parameterisation, positions of compressed entries, the image's
place in the prompt and the aligner's feature order) are the ones graphsim's executor documents; formats are
emulated by rounding when ``emulate`` is true.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

F32 = np.float32


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _sigmoid(x):  # the tanh form: no overflow for large |x|
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _silu(x):
    return x * _sigmoid(x)


def _softplus(x):
    return np.logaddexp(x, F32(0.0))


def _relu(x):
    return np.maximum(x, F32(0.0))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(F32(math.sqrt(2.0 / math.pi)) * (x + F32(0.044715) * x ** 3)))


def _top_k(x, k):
    """The k largest along the last axis, ties to the lower index (as XLA's TopK)."""
    idx = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, idx, axis=-1), idx


def _np(P):
    """The checkpoint's tensors as NumPy arrays (the reference runs in NumPy: no compilation per shape)."""
    return {k: np.asarray(v) for k, v in P.items()}


class Fmt:
    """Rounding to the V4.1 formats (or nothing)."""

    def __init__(self, on: bool):
        self.on = on

    @staticmethod
    def _grid(x, width, scale_of, dtype, lim=None):
        shp = x.shape
        b = min(width, shp[-1])
        t = x.reshape(shp[:-1] + (shp[-1] // b, b))
        s = scale_of(np.abs(t).max(axis=-1, keepdims=True))
        y = t / s
        if lim is not None:
            y = np.clip(y, -lim, lim)
        return (y.astype(dtype).astype(F32) * s).reshape(shp)

    def fp8(self, x):  # E4M3, power-of-two scale per 32
        if not self.on:
            return x
        return self._grid(x, 32, lambda a: np.where(a > 0, 2.0 ** np.ceil(np.log2(np.maximum(a, 1e-30) / 448.0)), 1.0),
                          ml_dtypes.float8_e4m3fn)

    def kv4(self, x):  # E2M1 + E4M3 scale per 16
        if not self.on:
            return x

        def sc(a):
            s = (a / 6.0).astype(ml_dtypes.float8_e4m3fn).astype(F32)
            return np.where(s > 0, s, 1.0)
        return self._grid(x, 16, sc, ml_dtypes.float4_e2m1fn, 6.0)

    def mx4(self, x):  # MXFP4: E2M1 + E8M0 2^(floor(log2 amax) - 2) per 32
        if not self.on:
            return x
        return self._grid(x, 32, lambda a: np.where(a > 0, 2.0 ** (np.floor(np.log2(np.maximum(a, 1e-30))) - 2.0), 1.0),
                          ml_dtypes.float4_e2m1fn, 6.0)

    def bf(self, x):
        return x.astype(ml_dtypes.bfloat16).astype(F32) if self.on else x


def _rms(x, w=None, eps=1e-6):
    y = x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def _rot(x, pos, rd, theta):
    half = rd // 2
    freq = 1.0 / (theta ** (np.arange(half, dtype=np.float64) * 2.0 / rd))
    ang = np.asarray(pos, F32)[:, None] * np.asarray(freq, F32)[None, :]
    if x.ndim == 3:
        ang = ang[:, None, :]
    c, s = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., -rd:-half], x[..., -half:]
    return np.concatenate([x[..., :-rd], x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)


def _roles(t):
    """Layer roles from the config lists alone: (path, kv owner, top-k producer) per trunk layer."""
    n = t["num_hidden_layers"]
    ratios = t["compress_ratios"][:n]
    kv, idx = t["kv_source_layer_ids"], t["index_source_layer_ids"]
    out = []
    for L in range(n):
        if ratios[L] == 0:
            out.append(("swa", None, None))
            continue
        owner = max(i for i in kv if i <= L)
        if L in kv:
            out.append(("full", L, L))
        elif L in idx:
            out.append(("reindex", owner, L))
        else:
            out.append(("reuse", owner, max(i for i in idx if owner <= i <= L)))
    return out


def _mhc_pre(P, p, X, iters):
    n = X.shape[1]
    flat = X.reshape(X.shape[0], -1)
    z = (flat @ P[f"{p}.fn"].T) / np.sqrt(np.mean(flat * flat, axis=-1, keepdims=True) + 1e-6)
    a, b = P[f"{p}.scale"], P[f"{p}.base"]
    pre = _sigmoid(z[:, :n] * a[0] + b[:n])
    post = 2 * _sigmoid(z[:, n:2 * n] * a[1] + b[n:2 * n])
    Z = (z[:, 2 * n:] * a[2] + b[2 * n:]).reshape(-1, n, n)
    M = np.exp(Z - Z.max(axis=(1, 2), keepdims=True))
    for _ in range(iters):
        M = M / M.sum(axis=2, keepdims=True)
        M = M / M.sum(axis=1, keepdims=True)
    return (pre[:, :, None] * X).sum(axis=1), post, M


def _mhc_post(X, post, M, y):
    return np.einsum("tij,tjd->tid", M, X) + post[:, :, None] * y[:, None, :]


def _engram(P, t, layer, X, ids, f, text=None):
    orders = range(2, t["engram_max_ngram_size"] + 1)
    heads, N = t["engram_n_heads"], t["engram_max_ngram_size"]
    rows = t["engram_num_embeddings"][t["engram_layer_ids"].index(layer)]
    vc, pad = t["engram_compressed_vocab_size"], t.get("engram_pad_token_id", 0)
    T = ids.shape[0]
    hist = np.full((T, N), pad, np.int64)
    for k in range(N):
        hist[k:, k] = np.asarray(ids)[:T - k] if k else np.asarray(ids)
    hist = (hist % vc).astype(np.uint64)
    keys = []
    for o in orders:
        for h in range(heads):
            acc = np.zeros(T, np.uint64)
            for k in range(o):
                mult = ((2654435761 * (1 + 31 * o + 131 * h + 17 * k)) & 0xFFFFFFFF) | 1
                acc = (acc + hist[:, k] * mult) & 0xFFFFFFFF
            keys.append(acc % rows)
    p = f"layers.{layer}.engram"
    e = P[f"{p}.table"][np.asarray(np.stack(keys, 1).astype(np.int32))].reshape(T, -1)
    proj = f.fp8(e) @ P[f"{p}.wkv"]
    n, d = X.shape[1], X.shape[2]
    K, V = proj[:, :n * d].reshape(T, n, d), proj[:, n * d:]
    gn = P[f"{p}.gate_norm"]
    g = _sigmoid((_rms(X, gn[0]) * _rms(K, gn[1])).sum(-1) / math.sqrt(d))
    if text is not None:  # image positions bypass Engram
        g = np.where(np.asarray(text)[:, None], g, 0.0)
    return X + g[:, :, None] * V[:, None, :]


def _experts(P, p, t, x, f, limit, k=None):
    logits = f.bf(x) @ P[f"{p}.gate.weight"]
    s = np.sqrt(_softplus(logits))
    k = k or t["num_experts_per_tok"]
    _, ids = _top_k(s + P[f"{p}.gate.bias"], k)
    w = np.take_along_axis(s, ids, 1)
    w = w / w.sum(-1, keepdims=True) * t["routed_scaling_factor"]
    xq = f.fp8(x)

    def glu(a, b):
        if limit:
            a, b = np.minimum(a, limit), np.clip(b, -limit, limit)
        return _silu(a) * b
    y = 0.0
    for j in range(k):
        e = ids[:, j]
        h = glu(np.einsum("td,tdf->tf", xq, P[f"{p}.experts.w1"][e]), np.einsum("td,tdf->tf", xq, P[f"{p}.experts.w3"][e]))
        y = y + w[:, j:j + 1] * np.einsum("tf,tfd->td", f.fp8(h), P[f"{p}.experts.w2"][e])
    s_ = f"{p}.shared_experts"
    hs = glu(xq @ P[f"{s_}.w1"], xq @ P[f"{s_}.w3"])
    return y + f.fp8(hs) @ P[f"{s_}.w2"]


def vision(P, config: dict, pixels, grid, *, emulate: bool = True):
    """Image features [tokens, hidden] of one image: ``pixels`` [rows·cols, channels·p²] in raster order of
    its patch ``grid`` (rows, cols)."""
    v = config["vision_config"]
    P = _np(P)
    f = Fmt(emulate)
    h, H, r = v["hidden_size"], v["num_attention_heads"], v["downsample_ratio"]
    hd, theta = h // H, v.get("rope_theta", 10000.0)
    gh, gw = grid
    row, col = np.arange(gh * gw) // gw, np.arange(gh * gw) % gw

    def rope2(x):  # [T, H, hd]: channels [0, hd/2) by the row, [hd/2, hd) by the column
        half = hd // 2
        return np.concatenate([_rot(x[..., :half], row, half, theta), _rot(x[..., half:], col, half, theta)], axis=-1)

    x = f.bf(np.asarray(pixels, F32)) @ P["vision.patch_embed.weight"]
    for i in range(v["num_hidden_layers"]):
        p = f"vision.blocks.{i}"
        qkv = f.bf(_rms(x, P[f"{p}.norm1"])) @ P[f"{p}.attn.wqkv"]
        q, k, val = (qkv[:, j * h:(j + 1) * h].reshape(-1, H, hd) for j in range(3))
        pr = _softmax(np.einsum("qhd,khd->hqk", rope2(q), rope2(k)) / math.sqrt(hd), axis=-1)
        x = x + f.bf(np.einsum("hqk,khd->qhd", pr, val).reshape(-1, h)) @ P[f"{p}.attn.wo"]
        y = f.bf(_rms(x, P[f"{p}.norm2"]))
        x = x + f.bf(_silu(y @ P[f"{p}.mlp.w1"]) * (y @ P[f"{p}.mlp.w3"])) @ P[f"{p}.mlp.w2"]
    x = np.asarray(_rms(x, P["vision.norm"])).reshape(gh, gw, h)
    th, tw = -(-gh // r), -(-gw // r)
    padded = np.zeros((th * r, tw * r, h), np.float32)
    padded[:gh, :gw] = x
    tok = np.stack([np.concatenate([padded[a * r + dy, b * r + dx] for dy in range(r) for dx in range(r)])
                    for a in range(th) for b in range(tw)])
    y = _gelu_tanh(f.bf(np.asarray(tok, F32)) @ P["vision.aligner.fc1"])
    return f.bf(y) @ P["vision.aligner.fc2"]


def forward(P, config: dict, ids, *, emulate: bool = True, swa_start: int = 0, layers_from: int | None = None,
            taps: dict | None = None, image=None):
    """Logits [N, vocab] of one request's token ids [N] (positions 0..N-1). ``swa_start``: decoder layers
    from ``layers_from`` on read no SWA entry before it (decoder bounded replay truncates their history).
    ``taps`` (a dict) receives each layer's attention input (its mHC pre-mix) under the layer number.
    ``image`` = (pixels, grid): an image whose tokens are the first positions of the sequence."""
    t = config.get("text_config", config)
    P = _np(P)
    f = Fmt(emulate)
    ids = np.asarray(ids)
    T = ids.shape[0]
    pos = np.arange(T)
    n, d = t["hc_mult"], t["hidden_size"]
    H, D, rd = t["num_attention_heads"], t["head_dim"], t["qk_rope_head_dim"]
    W, K = t["sliding_window"], t["index_topk"]
    Hi, Di = t["index_n_heads"], t["index_head_dim"]
    theta, ctheta = t.get("rope_theta", 10000.0), t.get("compress_rope_theta", t.get("rope_theta", 10000.0))
    iters, limit = t["hc_sinkhorn_iters"], t.get("swiglu_limit", 0.0) or 0.0
    cand_src, B, C = t["candidate_source_layer_id"], t["candidate_block_size"], t["candidate_topk_blocks"]
    roles = _roles(t)
    ratios = t["compress_ratios"]
    E0 = P["embed.weight"][np.asarray(ids)]
    text = None
    if image is not None:
        feats = vision(P, config, *image, emulate=emulate)
        E0 = E0.copy()
        E0[:feats.shape[0]] = feats
        text = np.arange(T) >= feats.shape[0]
    X = np.repeat(E0[:, None, :], n, axis=1)
    owner_kv, owner_ik, topk_of, pool = {}, {}, {}, None
    for L, (path, owner, prod) in enumerate(roles):
        p = f"layers.{L}"
        if L in t["engram_layer_ids"]:
            X = _engram(P, t, L, X, ids, f, text)
        hmix, post, M = _mhc_pre(P, f"{p}.hc_attn", X, iters)
        if taps is not None:
            taps[L] = hmix
        h = f.fp8(_rms(hmix, P[f"{p}.attn_norm"]))
        qr = f.fp8(_rms(f.fp8(h) @ P[f"{p}.attn.wq_a"], P[f"{p}.attn.q_norm"]))
        q = _rot((f.fp8(qr) @ P[f"{p}.attn.wq_b"]).reshape(T, H, D), pos, rd, theta)
        kv = _rot(_rms(f.fp8(h) @ P[f"{p}.attn.wkv"], P[f"{p}.attn.kv_norm"]), pos, rd, theta)
        swa = f.fp8(kv)
        if path == "full":
            m = ratios[L]
            c = f"{p}.attn.compressor"
            if m > 1:
                e = T // m
                ck = (h @ P[f"{c}.wkv"])[:e * m].reshape(e, m, D)
                cg = (h @ P[f"{c}.wgate"])[:e * m].reshape(e, m, D)
                ent = (_softmax(cg, axis=1) * ck).sum(1)
            else:
                e = T
                ent = f.bf(h) @ P[f"{c}.wkv"]
            ent = f.kv4(_rot(ent, np.arange(e) * m, rd, ctheta))
            owner_kv[L] = ent
            ix = f"{p}.attn.indexer"
            owner_ik[L] = f.mx4(_rms(f.bf(ent) @ P[f"{ix}.wk"], P[f"{ix}.k_norm"]))
        if path in ("full", "reindex"):
            ix = f"{p}.attn.indexer"
            m = ratios[owner]
            qi = f.mx4(f.fp8(qr) @ P[f"{ix}.wq_b"]).reshape(T, Hi, Di)
            wi = f.bf(h) @ P[f"{ix}.weights_proj"]
            ik = owner_ik[owner]
            E = ik.shape[0]
            sc = (_relu(np.einsum("thd,ed->the", qi, ik)) * wi[:, :, None]).sum(1) / math.sqrt(Hi * Di)
            visible = np.arange(E)[None, :] < ((pos + 1) // m)[:, None]
            if path == "reindex" and L > cand_src:
                visible = np.asarray(visible) & pool
            sc = np.where(visible, sc, -np.inf)
            if L == cand_src:  # block max, candidate pool (newest visible block always kept)
                nb = -(-E // B)
                bm = np.pad(sc, ((0, 0), (0, nb * B - E)), constant_values=-np.inf).reshape(T, nb, B).max(-1)
                newest = ((pos + 1) // m - 1) // B
                bm = np.where(np.arange(nb)[None, :] == newest[:, None], np.inf, bm)
                top, bi = _top_k(bm, min(C, nb))
                keep = np.zeros((T, nb), bool)
                keep[np.arange(T)[:, None], bi] = top > -np.inf
                pool = np.repeat(keep, B, axis=1)[:, :E]
            top, ti = _top_k(sc, min(K, E))
            topk_of[L] = (ti, top > -np.inf)
        # attention: the SWA window + the selected compressed entries, a sink per head
        start = swa_start if (layers_from is not None and L >= layers_from) else 0
        kp = pos[:, None] - np.arange(W)[None, ::-1]
        ok_w = kp >= max(start, 0)
        keys = [swa[np.maximum(kp, 0)]]
        oks = [np.asarray(ok_w)]
        if owner is not None:
            ti, tv = topk_of[prod]
            keys.append(owner_kv[owner][ti])
            oks.append(tv)
        Kx = np.concatenate(keys, 1)
        ok = np.concatenate(oks, 1)
        lg = np.where(ok[:, None, :], np.einsum("thd,tsd->ths", q, Kx) / math.sqrt(D), -np.inf)
        sink = P[f"{p}.attn.sink"]
        lg_all = np.concatenate([lg, np.broadcast_to(sink[None, :, None], (T, H, 1))], axis=-1)
        pr = _softmax(lg_all, axis=-1)[..., :-1]
        o = np.einsum("ths,tsd->thd", pr, Kx).reshape(T, H * D)
        G = P[f"{p}.attn.wo_a"].shape[0]
        oa = np.einsum("tgk,gkn->tgn", f.bf(o).reshape(T, G, -1), P[f"{p}.attn.wo_a"]).reshape(T, -1)
        X = _mhc_post(X, post, M, f.fp8(oa) @ P[f"{p}.attn.wo_b"])
        hmix, post, M = _mhc_pre(P, f"{p}.hc_ffn", X, iters)
        h2 = f.fp8(_rms(hmix, P[f"{p}.ffn_norm"]))
        X = _mhc_post(X, post, M, _experts(P, f"{p}.ffn", t, h2, f, limit))
    hf = _rms(X.mean(axis=1), P["norm.weight"])
    return f.bf(hf) @ P["head.weight"]


def draft(P, config: dict, ids, *, emulate: bool = True):
    """DSpark after a forward over ``ids``: the drafter's 5 positions after the prompt. Returns (draft tokens,
    confidences). Context: the target layers' attention inputs at the last W positions, concatenated and
    projected; block input: the target's greedy next token then noise tokens; 3 SWA-only blocks (context KV
    from the projected context, draft positions causal among themselves), the trunk's head plus the Markov
    head (vocab -> rank -> vocab on the previous draft token), the confidence head on [hidden, Markov]."""
    t = config.get("text_config", config)
    P = _np(P)
    f = Fmt(emulate)
    taps: dict = {}
    logits = forward(P, config, ids, emulate=emulate, taps=taps)
    N = len(ids)
    n, d = t["hc_mult"], t["hidden_size"]
    H, D, rd, W = t["num_attention_heads"], t["head_dim"], t["qk_rope_head_dim"], t["sliding_window"]
    A = t["dspark_block_size"]
    theta = t.get("rope_theta", 10000.0)
    lo = N - min(N, W)
    cpos = np.arange(lo, N)
    ctx = np.concatenate([taps[L][lo:] for L in t["dspark_target_layer_ids"]], axis=-1)
    ctx = f.bf(ctx) @ P["dspark.main_proj"]
    tok = [int(np.argmax(logits[-1]))] + [t["dspark_noise_token_id"]] * (A - 1)
    X = np.repeat(P["embed.weight"][np.asarray(tok)][:, None, :], n, axis=1)
    dpos = np.arange(N, N + A)
    limit = t.get("swiglu_limit", 0.0) or 0.0
    for j in range(t["num_nextn_predict_layers"]):
        p = f"dspark.blocks.{j}"
        ck = f.fp8(_rot(_rms(f.bf(ctx) @ P[f"{p}.attn.wkv"], P[f"{p}.attn.kv_norm"]), cpos, rd, theta))
        hmix, post, M = _mhc_pre(P, f"{p}.hc_attn", X, t["hc_sinkhorn_iters"])
        h = f.fp8(_rms(hmix, P[f"{p}.attn_norm"]))
        qr = f.fp8(_rms(f.fp8(h) @ P[f"{p}.attn.wq_a"], P[f"{p}.attn.q_norm"]))
        q = _rot((f.fp8(qr) @ P[f"{p}.attn.wq_b"]).reshape(A, H, D), dpos, rd, theta)
        kd = _rot(_rms(f.fp8(h) @ P[f"{p}.attn.wkv"], P[f"{p}.attn.kv_norm"]), dpos, rd, theta)
        keys = np.concatenate([ck, kd], axis=0)
        kpos = np.concatenate([cpos, dpos])
        ok = (kpos[None, :] <= dpos[:, None]) & (kpos[None, :] > dpos[:, None] - W)
        lg = np.where(ok[:, None, :], np.einsum("thd,sd->ths", q, keys) / math.sqrt(D), -np.inf)
        sink = P[f"{p}.attn.sink"]
        lg = np.concatenate([lg, np.broadcast_to(sink[None, :, None], (A, H, 1))], axis=-1)
        o = np.einsum("ths,sd->thd", _softmax(lg, axis=-1)[..., :-1], keys).reshape(A, H * D)
        G = P[f"{p}.attn.wo_a"].shape[0]
        oa = np.einsum("tgk,gkn->tgn", f.bf(o).reshape(A, G, -1), P[f"{p}.attn.wo_a"]).reshape(A, -1)
        X = _mhc_post(X, post, M, f.fp8(oa) @ P[f"{p}.attn.wo_b"])
        hmix, post, M = _mhc_pre(P, f"{p}.hc_ffn", X, t["hc_sinkhorn_iters"])
        h2 = f.fp8(_rms(hmix, P[f"{p}.ffn_norm"]))
        X = _mhc_post(X, post, M, _experts(P, f"{p}.ffn", t, h2, f, limit, k=t["dspark_num_experts_per_tok"]))
    hn = _rms(X.mean(axis=1), P["dspark.norm"])
    dl = f.bf(hn) @ P["head.weight"]
    prev = np.concatenate([np.asarray(tok[:1]), np.argmax(dl[:-1], axis=-1)])
    mk = P["dspark.markov.embed"][prev]
    tokens = np.argmax(dl + f.bf(mk) @ P["dspark.markov.proj"], axis=-1)
    conf = _sigmoid(np.concatenate([hn, mk], axis=-1) @ P["dspark.confidence.proj"])
    return np.asarray(tokens), np.asarray(conf)
