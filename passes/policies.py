"""Which policy passes a model runs for a plan's policies (bounded replays, fusion), in order."""
from __future__ import annotations

from .fusion import fuse_mhc, fuse_norm_quant
from .replay import apply_decoder_replay, apply_encoder_replay

#: V4.1 query-side token sets (graphsim/models/deepseek_v41_graph.py): what a restore replays
V41_QUERY_SETS = ("q_enc", "q_dkv", "q_dec", "kv_in", "eng_q_enc", "eng_q_dkv", "eng_q_dec")


def policy_passes(model, policies) -> list:
    """(name, pass) pairs for a CED model (DeepSeek-V4.1-Flash). Encoder replay first, so the decoder tail
    is taken over replayed + new positions; fusion last (it only merges ops)."""
    out = []
    if policies.encoder_replay == "on":
        out.append(("encoder_replay", apply_encoder_replay(V41_QUERY_SETS)))
    if policies.decoder_replay != "off":  # (rejected with DSpark on: SGLang replays only without it)
        out.append((f"decoder_replay[{policies.decoder_replay}]",
                    apply_decoder_replay(policies.decoder_replay, policies.replay_window)))
    if policies.fusion != "unfused":
        c = model.cfg
        out.append((f"fuse_mhc[{policies.fusion}]", fuse_mhc(policies.fusion, n=c.hc_mult, d=c.hidden_size)))
        out.append(("fuse_norm_quant", fuse_norm_quant))
    return out
