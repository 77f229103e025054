"""DSpark speculative decoding: the acceptance model and the per-request verify-length scheduler.

Independent of any graph. One drafter forward proposes ``D = text_config.dspark_block_size`` (= 5) draft
tokens in parallel; its confidence head predicts the *conditional* acceptance ``a_j = P(draft j accepted |
drafts 1..j-1 accepted)``. The scheduler turns them into prefix-survival probabilities
``s_j = prod_{i<=j} a_i`` and, with an engine step-time curve, picks how many drafts ``k`` to verify for
each request (V41_FACTS §9; seed 000: "再结合预测接受概率与引擎吞吐曲线，为每个请求选择值得验证的长度").

Token-count convention ("bonus token"): a verify forward over ``k`` drafts (``1 + k`` target positions)
accepts the longest prefix of drafts the target agrees with, and ALWAYS emits one more token from the
target's own distribution: the correction token at the first rejected position, or the bonus token after
position ``k`` when all ``k`` drafts are accepted. Hence ``emitted = accepted + 1`` and

    E[emitted | k] = 1 + sum_{j=1..k} s_j,    P(emitted = 1 + j) = s_j - s_{j+1} (j < k),  s_k (j = k),

with ``s_0 = 1``. ``k = 0`` is plain decode (1 token); all ``a = 1`` and ``k = D`` gives ``D + 1``.
It is never "rate x D": acceptance is prefix-dependent, so a late draft only counts if all earlier ones did.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import attrs
import numpy as np

from ..core.errors import GraphsimError, require

__all__ = [
    "AcceptanceProfile",
    "VerifyPlan",
    "RequestBurst",
    "block_size_from_config",
    "choose_verify_lengths",
]


def block_size_from_config(config: Mapping) -> int:
    """``D``: draft positions per drafter forward (``text_config.dspark_block_size``; also accepts the text config)."""
    text = config.get("text_config", config)
    require("dspark_block_size" in text, "text_config.dspark_block_size", "missing from the config")
    d = text["dspark_block_size"]
    require(isinstance(d, int) and not isinstance(d, bool) and d > 0,
            "text_config.dspark_block_size", f"must be a positive integer, got {d!r}")
    return d


def _acceptance_matrix(x, field: str) -> np.ndarray:
    """Validate a (R, D) table of conditional acceptances; returns a read-only float64 copy."""
    try:
        a = np.array(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise GraphsimError(field, f"must be a numeric table of shape (requests, draft positions): {e}") from None
    if a.ndim == 1:
        a = a[None, :]
    require(a.ndim == 2, field, f"must be 1-D (one request) or 2-D (requests, positions), got {a.ndim}-D")
    require(a.shape[0] >= 1, field, "needs at least one request row")
    require(a.shape[1] >= 1, field, "needs at least one draft position")
    bad = ~np.isfinite(a) | (a < 0.0) | (a > 1.0)
    if bad.any():
        r, j = np.argwhere(bad)[0]
        raise GraphsimError(field, f"acceptance must be a probability in [0, 1]; request {r}, position {j + 1} has {a[r, j]!r}")
    a.setflags(write=False)
    return a


def _survival_to_acceptance(s: np.ndarray) -> np.ndarray:
    """Effective conditional acceptance whose prefix products are exactly ``s`` (s_0 = 1 prepended)."""
    prev = np.concatenate([np.ones_like(s[:, :1]), s[:, :-1]], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(prev > 0.0, s / np.where(prev > 0.0, prev, 1.0), 0.0)
    # Rounding can push a ratio a hair above 1 (s_j == s_{j-1} computed in two ways).
    return np.clip(a, 0.0, 1.0)


@attrs.frozen(eq=False)
class AcceptanceProfile:
    """Per-request, per-position conditional acceptance ``a`` of shape (R, D), each in [0, 1].

    For a request whose acceptance is itself random (a distribution over requests/prompts), the row stores
    the *effective* ``a_j = E[s_j] / E[s_{j-1}]``: its prefix products equal the expected survival exactly,
    and both E[emitted] and the emitted-token distribution are linear in ``s``, so they come out exact —
    unlike plugging the mean ``a`` into the product (``E[prod a] != prod E[a]``).
    """

    a: np.ndarray = attrs.field(converter=lambda x: _acceptance_matrix(x, "a"))

    # ---- constructors -------------------------------------------------------------------------------

    @classmethod
    def constant(cls, a, *, n_requests: int = 1, block_size: int | None = None) -> "AcceptanceProfile":
        """The same vector ``a`` (length D; or a scalar repeated over ``block_size`` positions) for every request."""
        require(isinstance(n_requests, int) and n_requests >= 1, "n_requests", f"must be a positive integer, got {n_requests!r}")
        if np.ndim(a) == 0:
            require(block_size is not None, "block_size", "is required with a scalar acceptance (see block_size_from_config)")
            require(isinstance(block_size, int) and block_size >= 1, "block_size", f"must be a positive integer, got {block_size!r}")
            a = np.full(block_size, float(a))
        row = _acceptance_matrix(a, "a")
        require(row.shape[0] == 1, "a", "constant() takes one vector; use from_table for per-request rows")
        require(block_size is None or row.shape[1] == block_size, "a", f"has {row.shape[1]} positions, block_size is {block_size}")
        return cls(np.repeat(row, n_requests, axis=0))

    @classmethod
    def from_table(cls, table) -> "AcceptanceProfile":
        """One row of ``D`` conditional acceptances per request (a user table, e.g. confidence-head outputs)."""
        return cls(_acceptance_matrix(table, "table"))

    @classmethod
    def from_beta(cls, alpha: float, beta: float, *, block_size: int, n_requests: int = 1) -> "AcceptanceProfile":
        """Requests draw one rate ``p ~ Beta(alpha, beta)`` shared by all positions (``a_j = p``).

        Exact: ``E[s_j] = E[p^j] = prod_{i<j} (alpha + i) / (alpha + beta + i)``. The shared rate models
        request difficulty: an easy prompt is easy at every position, which raises E[emitted] over the
        plug-in ``(E p)^j``.
        """
        for name, v in (("alpha", alpha), ("beta", beta)):
            require(np.isfinite(v) and v > 0, name, f"Beta parameter must be a finite positive number, got {v!r}")
        require(isinstance(block_size, int) and block_size >= 1, "block_size", f"must be a positive integer, got {block_size!r}")
        require(isinstance(n_requests, int) and n_requests >= 1, "n_requests", f"must be a positive integer, got {n_requests!r}")
        i = np.arange(block_size, dtype=np.float64)
        s = np.cumprod((alpha + i) / (alpha + beta + i))[None, :]
        return cls(np.repeat(_survival_to_acceptance(s), n_requests, axis=0))

    @classmethod
    def from_mixture(cls, vectors, weights) -> "AcceptanceProfile":
        """One request whose acceptance vector is ``vectors[m]`` with probability ``weights[m]`` (normalized).

        Exact: ``E[s_j] = sum_m w_m prod_{i<=j} a_{m,i}``.
        """
        v = _acceptance_matrix(vectors, "vectors")
        w = np.asarray(weights, dtype=np.float64).reshape(-1)
        require(w.shape[0] == v.shape[0], "weights", f"has {w.shape[0]} entries for {v.shape[0]} vectors")
        require(bool(np.all(np.isfinite(w) & (w >= 0))) and w.sum() > 0, "weights",
                "must be finite, non-negative and not all zero")
        s = (w / w.sum()) @ np.cumprod(v, axis=1)
        return cls(_survival_to_acceptance(s[None, :]))

    @classmethod
    def stack(cls, profiles: Sequence["AcceptanceProfile"]) -> "AcceptanceProfile":
        """Concatenate profiles (one batch of requests); all must share ``D``."""
        require(len(profiles) > 0, "profiles", "needs at least one profile")
        d = {p.block_size for p in profiles}
        require(len(d) == 1, "profiles", f"mix draft depths {sorted(d)}; one batch has one D")
        return cls(np.concatenate([p.a for p in profiles], axis=0))

    # ---- shape --------------------------------------------------------------------------------------

    @property
    def n_requests(self) -> int:
        return self.a.shape[0]

    @property
    def block_size(self) -> int:
        """``D``: draft positions per drafter forward."""
        return self.a.shape[1]

    # ---- survival and token counts ------------------------------------------------------------------

    @property
    def survival(self) -> np.ndarray:
        """(R, D+1): ``s_j = prod_{i<=j} a_i`` for j = 0..D (``s_0 = 1``)."""
        return np.concatenate([np.ones((self.n_requests, 1)), np.cumprod(self.a, axis=1)], axis=1)

    def expected_emitted_table(self) -> np.ndarray:
        """(R, D+1): E[emitted | k] for k = 0..D (bonus-token convention, see module doc)."""
        # cumsum over s_0..s_k = 1 + sum_{j=1..k} s_j: the leading s_0 = 1 IS the always-emitted target token.
        return np.cumsum(self.survival, axis=1)

    def _check_k(self, k, field: str = "k") -> np.ndarray:
        k = np.asarray(k)
        require(k.dtype.kind in "iu" or (k.dtype.kind == "f" and bool(np.all(k == np.round(k)))), field,
                "verify lengths must be integers")
        k = k.astype(np.int64)
        bad = (k < 0) | (k > self.block_size)
        if bad.any():
            raise GraphsimError(field, f"verify lengths must lie in 0..{self.block_size} (D), got {k[bad].flat[0]}")
        try:
            np.broadcast_shapes(k.shape, (self.n_requests,))
        except ValueError:
            raise GraphsimError(field, f"shape {k.shape} does not broadcast against {self.n_requests} requests") from None
        return k

    def expected_emitted(self, k) -> np.ndarray:
        """E[emitted | k] per request; ``k`` broadcasts against (R,), e.g. (C, R) candidates -> (C, R)."""
        k = self._check_k(k)
        k = np.broadcast_to(k, np.broadcast_shapes(k.shape, (self.n_requests,)))
        table = self.expected_emitted_table()
        rows = np.broadcast_to(np.arange(self.n_requests), k.shape)
        return table[rows, k]

    def expected_accepted(self, k) -> np.ndarray:
        """E[accepted drafts | k] = E[emitted | k] - 1 (the target's own token is not a draft)."""
        return self.expected_emitted(k) - 1.0

    def emitted_distribution(self, k) -> np.ndarray:
        """(R, D+1): column j = P(emitted = 1 + j) given per-request verify length ``k`` (shape () or (R,)).

        ``P(1 + j) = s_j - s_{j+1}`` for j < k, ``s_k`` for j = k, 0 beyond k: the size of the token
        burst a client receives from one verify step (for ITL reporting).
        """
        k = self._check_k(k)
        require(k.ndim <= 1, "k", "emitted_distribution takes one verify length per request")
        k = np.broadcast_to(k, (self.n_requests,))
        s = self.survival
        j = np.arange(self.block_size + 1)[None, :]
        s_next = np.concatenate([s[:, 1:], np.zeros((self.n_requests, 1))], axis=1)
        # At j == k the step stops verifying: surviving to j means exactly j drafts accepted.
        p = np.where(j < k[:, None], s - s_next, np.where(j == k[:, None], s, 0.0))
        return np.clip(p, 0.0, 1.0)


# --------------------------------------------------------------------------------------------------
# Verify-length scheduler
# --------------------------------------------------------------------------------------------------

StepTime = Callable[[np.ndarray], np.ndarray]


@attrs.frozen
class RequestBurst:
    """One request's output cadence under a plan.

    A verify step's time is NOT this request's ITL: the step delivers a burst of ``1 + accepted`` tokens
    at once (near-zero gaps inside a burst, one ``step_time`` between bursts, plus scheduling waits that
    live outside the forward). ``mean_time_per_token = step_time / E[emitted]`` is the long-run average
    gap (renewal-reward: ratio of expectations, not E[step_time / emitted]).
    """

    k: int
    tokens_per_step: float  #: E[emitted] per verify step
    step_time: float  #: seconds between bursts
    mean_time_per_token: float  #: step_time / E[emitted]
    burst_distribution: tuple  #: P(burst = 1 + j) for j = 0..D


@attrs.frozen(eq=False)
class VerifyPlan:
    """A batch's chosen verify lengths and what they buy.

    ``throughput = sum_r E[emitted_r | k_r] / step_time(k)`` (expected tokens per second of the batch;
    ``E[emitted] / E[step time]`` with a deterministic step time per k-vector).
    """

    k: np.ndarray  #: (R,) chosen verify length per request
    expected_emitted: np.ndarray  #: (R,) E[emitted | k_r], bonus-token convention
    step_time: float  #: seconds for one draft + verify step of this batch (from the step_time callable)
    throughput: float  #: expected emitted tokens / s over the whole batch
    burst_distribution: np.ndarray  #: (R, D+1): P(emitted_r = 1 + j)
    evaluations: int  #: candidate k-vectors priced (step_time rows)

    @property
    def verify_tokens(self) -> int:
        """Target positions verified this step: sum_r (1 + k_r)."""
        return int(np.sum(1 + self.k))

    @property
    def mean_time_per_token(self) -> np.ndarray:
        """(R,) long-run mean ITL per request: step_time / E[emitted] (not the step time itself)."""
        return self.step_time / self.expected_emitted

    def requests(self) -> tuple[RequestBurst, ...]:
        """Per-request ITL view as bursts."""
        return tuple(
            RequestBurst(int(self.k[r]), float(self.expected_emitted[r]), self.step_time,
                         float(self.step_time / self.expected_emitted[r]), tuple(map(float, self.burst_distribution[r])))
            for r in range(self.k.shape[0])
        )


def _price(step_time: StepTime, cands: np.ndarray) -> np.ndarray:
    """Call the user's step-time curve on (C, R) candidates and check it returned (C,) positive seconds."""
    t = np.asarray(step_time(cands.copy()), dtype=np.float64)
    require(t.shape == (cands.shape[0],), "step_time", f"must return shape ({cands.shape[0]},) for {cands.shape} candidates, got {t.shape}")
    require(bool(np.all(np.isfinite(t) & (t > 0))), "step_time", "must return finite positive seconds")
    return t


def choose_verify_lengths(profiles: AcceptanceProfile | Sequence[AcceptanceProfile], step_time: StepTime, *,
                          k_max: int | None = None, rtol: float = 1e-12) -> VerifyPlan:
    """Choose each request's verify length k_r in 0..k_max maximizing the batch's expected tokens/s.

    ``step_time(K)`` takes an int array (C, R) of candidate k-vectors and returns (C,) seconds for one
    step (drafter + target verify + commit/rollback at that shape; it may depend on sum_r (1 + k_r) and on
    each request's context). Steepest ascent from k = 0 (plain decode): each round prices all single-request
    +-1 moves in one vectorized call and takes the best if it improves throughput by more than ``rtol``
    (relative); it stops when no move does, so every k_r beats (or ties) its +-1 neighbours. Deterministic:
    ties go to the lowest request index, + before -. For an affine step time this local optimum is global
    (E[emitted] is concave in k because s_j is non-increasing).
    """
    prof = profiles if isinstance(profiles, AcceptanceProfile) else AcceptanceProfile.stack(list(profiles))
    d = prof.block_size
    k_max = d if k_max is None else k_max
    require(isinstance(k_max, (int, np.integer)) and 0 <= k_max <= d, "k_max", f"must be an integer in 0..{d} (D), got {k_max!r}")
    require(callable(step_time), "step_time", "must be a callable (C, R) int array -> (C,) seconds")
    r_n = prof.n_requests
    table = prof.expected_emitted_table()  # (R, D+1)
    rows = np.arange(r_n)

    k = np.zeros(r_n, dtype=np.int64)
    t_cur = float(_price(step_time, k[None, :])[0])
    emitted = float(table[rows, k].sum())
    best = emitted / t_cur
    evaluations = 1
    # Moves: +1 for every request, then -1 for every request (fixed order => deterministic tie-break).
    eye = np.eye(r_n, dtype=np.int64)
    moves = np.concatenate([eye, -eye], axis=0)
    # Strict improvement means no state repeats; the cap only guards against a non-deterministic callable.
    for _ in range(4 * r_n * (k_max + 1) + 16):
        cands = k[None, :] + moves
        ok = np.all((cands >= 0) & (cands <= k_max), axis=1)
        cands = cands[ok]
        if cands.shape[0] == 0:
            break
        t = _price(step_time, cands)
        evaluations += cands.shape[0]
        thr = table[rows[None, :], cands].sum(axis=1) / t
        i = int(np.argmax(thr))
        if not thr[i] > best * (1.0 + rtol):
            break
        k, best, t_cur = cands[i].copy(), float(thr[i]), float(t[i])
    else:
        raise GraphsimError("step_time", "scheduler did not converge; is the step-time callable deterministic?")

    k.setflags(write=False)
    e = table[rows, k]
    e.setflags(write=False)
    dist = prof.emitted_distribution(k)
    dist.setflags(write=False)
    return VerifyPlan(k=k, expected_emitted=e, step_time=t_cur, throughput=float(e.sum() / t_cur),
                      burst_distribution=dist, evaluations=evaluations)
