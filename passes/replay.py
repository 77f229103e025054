"""Bounded replay policies as token-set rewrites (V41_FACTS §4, §5). Ops never change; only *which tokens*
their token sets select for prefill requests. Decode rules are never touched (decode tokens cross the whole
trunk), and the global-KV token set is never shortened (every position that needs a cache gets one)."""
from __future__ import annotations

import attrs

from graphsim.core.errors import GraphsimError
from graphsim.core.ir import Graph, TokenSet

from .pipeline import NO_CONTEXT, PassContext

#: profile -> which query-side token sets run only the per-request tail
DECODER_REPLAY = {
    "off": (),
    "sglang": ("q_dec", "eng_q_dec"),  # layers after max(kv_source): SGLang's late_layer_start cut (rev 1aa0e96)
    "paper": ("q_dkv", "q_dec", "eng_q_dkv", "eng_q_dec"),  # the whole Decoder on the last W: N·L/2 + W·L/2
}


def _rewrite(graph: Graph, names, fn, note: str) -> Graph:
    out = []
    for ts in graph.token_sets:
        out.append(attrs.evolve(ts, prefill=fn(ts.prefill)) if ts.name in names else ts)
    meta = attrs.evolve(graph.meta, token_set_rewrites=(*graph.meta.token_set_rewrites, note))
    return graph.evolve(token_sets=tuple(out), meta=meta)


def apply_decoder_replay(profile: str, window: int, sets=DECODER_REPLAY):
    """Pass factory: prefill queries of the Decoder's late layers run only each request's last
    min(extend, W) tokens (per request, per chunk), keeping any restore-replayed prefix in the extend."""
    if profile not in sets:
        raise GraphsimError("policies.decoder_replay", f"unknown profile {profile!r}; allowed {tuple(sets)}")

    def tail(rule: str) -> str:
        prefix = "replay+" if rule.startswith("replay+") else ""
        base = rule[len(prefix):]
        if base not in ("all", "text"):  # text: an Engram set; image tokens inside the tail are an approximation
            raise GraphsimError("policies.decoder_replay", f"cannot shorten token rule {rule!r} (expected 'all')")
        # dtail: the tail's SWA history is truncated at the replay start (V41_FACTS §4: approximate)
        return f"{prefix}dtail:{window}"

    def run(graph: Graph, ctx: PassContext = NO_CONTEXT) -> Graph:
        names = set(sets[profile]) & set(graph.token_set_map)
        return _rewrite(graph, names, tail, f"decoder_replay={profile}:W={window}")

    run.__doc__ = f"Decoder bounded replay ({profile}): late-layer prefill queries on the last {window} tokens."
    return run


def apply_encoder_replay(query_sets: tuple[str, ...]):
    """Pass factory: prefix restore with the SWA cache missing recomputes the replayed cached positions
    together with the suffix in every query-side op (they regenerate SWA KV); KV-producing sets are left
    alone, so replayed positions read, never rewrite, the cached global KV."""

    def add(rule: str) -> str:
        return rule if rule.startswith("replay+") or rule == "none" else f"replay+{rule}"

    def run(graph: Graph, ctx: PassContext = NO_CONTEXT) -> Graph:
        names = set(query_sets) & set(graph.token_set_map)
        return _rewrite(graph, names, add, "encoder_replay=on")

    run.__doc__ = "Encoder bounded replay: replayed prefix positions join the query side of every layer."
    return run


def token_set(graph: Graph, name: str) -> TokenSet:
    return graph.token_set_map[name]
