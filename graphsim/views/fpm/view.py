"""The FPM view: a plan's forward = its SOL forward x the fitted ratio of the one partition whose identity
matches the plan (docs/fpm.md). The graph, schedule and breakdowns stay SOL's (FPM times whole forwards,
not ops); the forward time, and what derives from it (TTFT, ITL, throughput), are FPM's. A plan no partition
matches is refused, naming the nearest partition and the fields that differ; a point outside the
partition's sampled coordinates is marked extrapolated."""
from __future__ import annotations

import attrs
import numpy as np

from graphsim.core.errors import GraphsimError

from .fit import FPMModel, Partition, predict
from .schema import COORDS, plan_identity

_MODELS: dict = {}


def _load(path: str) -> FPMModel:
    """A model file, read once per content (a file edited in place is read again)."""
    from graphsim.driver.identity import fpm_digest

    key = (path, fpm_digest(path))
    if key not in _MODELS:
        while len(_MODELS) >= 16:
            _MODELS.pop(next(iter(_MODELS)))
        _MODELS[key] = FPMModel.load(path)
    return _MODELS[key]


@attrs.frozen(eq=False)
class FPMView:
    path: str
    partition: Partition
    backend: str  # FRAMEWORK@VERSION of the partition

    def coords(self, workload) -> dict:
        """The samples' coordinate sums from workload arrays (P points)."""
        P = workload.points
        out = {c: np.zeros(P) for c in COORDS}
        for g, kind in enumerate(workload.kinds):
            cnt = workload.count[:, g]
            out[f"{kind}_requests"] += cnt
            out[f"{kind}_tokens"] += cnt * workload.new[:, g]
            out[f"{kind}_past"] += cnt * workload.past[:, g]
        return out

    def scale(self, workload, forward_sol):
        """The FPM forwards of every point (a :class:`graphsim.views.fpm.fit.Prediction`)."""
        return predict(self.partition, self.coords(workload), np.asarray(forward_sol, np.float64))

    def describe(self, workload, forward_sol) -> dict:
        pr = self.scale(workload, forward_sol)
        t, mix = pr.t, str(pr.mixes[0])
        if not np.isfinite(t[0]):
            have = ", ".join(self.partition.curves) or "none"
            raise GraphsimError("fpm", f"partition {self.partition.key} has no {mix or 'empty'} forwards (sampled mixes: "
                                f"{have}); collect some with graphsim collect forward")
        cur = self.partition.curves[mix]
        return {"view": "fpm", "backend": self.backend, "device": self.partition.identity["device"],
                "partition": self.partition.key, "model_file": self.path, "mix": mix,
                "sol_forward_s": float(forward_sol[0]), "fpm_forward_s": float(t[0]),
                "ratio": float(t[0] / forward_sol[0]) if forward_sol[0] > 0 else None,
                "domain": "in" if pr.inside[0] else "extrapolated", "outside": pr.outside_names(0),
                "curve": cur.describe(), "samples": cur.n,
                "train_error": {"median": cur.train_err[0], "p90": cur.train_err[1], "worst": cur.train_err[2]}}


def bind_fpm(spec, model, plan, hw) -> FPMView:
    """The FPM partition of ``plan`` (``spec.measured``: the .fpm file; ``spec.backend``: optional
    FRAMEWORK[@VERSION] when the file holds several runtimes)."""
    fpm = _load(str(spec.measured))
    part = fpm.find(plan_identity(model, plan.mapping, plan.policies, hw), spec.backend)
    i = part.identity
    return FPMView(str(spec.measured), part, f"{i['framework']}@{i['version']}")
