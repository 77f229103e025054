"""``graphsim fpm fit SAMPLES... -o model.fpm`` and ``graphsim fpm eval model.fpm --holdout SAMPLES``
(docs/fpm.md)."""
from __future__ import annotations

import json


def cmd_fpm(a) -> None:
    from ..core.errors import GraphsimError

    if a.action == "fit":
        from ..views.fpm.fit import fit_files

        if not a.inputs:
            raise GraphsimError("samples", "give the samples to fit: graphsim fpm fit samples.parquet -o model.fpm")
        if not a.output:
            raise GraphsimError("output", "required: the model file to write (-o model.fpm)")
        model = fit_files(a.inputs, a.output, log=None if a.json else print)
        if a.json:
            print(json.dumps(model.to_json(), indent=1))
        return
    if a.action == "eval":
        import pandas as pd

        from ..views.fpm.evaluate import evaluate, to_text
        from ..views.fpm.fit import FPMModel
        from ..views.fpm.schema import read_samples

        if len(a.inputs) != 1:
            raise GraphsimError("model", "give one FPM model: graphsim fpm eval model.fpm --holdout samples.parquet")
        if not a.holdout:
            raise GraphsimError("holdout", "required: the held-out samples (--holdout samples.parquet)")
        model = FPMModel.load(a.inputs[0])
        hold = pd.concat([read_samples(p) for p in a.holdout], ignore_index=True)
        op_view = None
        if a.measured:
            op_view = _op_view(a, hold)
        rep = evaluate(model, hold, op_view=op_view, log=None if a.json else print)
        from ..core.outputs import emit

        emit(a.output, (json.dumps(rep, indent=1) if a.json else to_text(rep)) + "\n")
        return
    raise GraphsimError("action", f"must be fit or eval, got {a.action!r}")


def _op_view(a, hold):
    """(model, hw, ViewSpec) for the OP column: the model and descriptor the samples name (checked by digest)."""
    from ..core.errors import GraphsimError
    from ..views.fpm.schema import hw_digest, model_identity
    from ..hw import load_hw
    from ..views.measured.view import ViewSpec
    from ..models import load_model

    if not a.model or not a.hw:
        raise GraphsimError("measured", "the OP column needs --model and --hw (the model and descriptor the samples "
                            "were collected with)")
    m = load_model(a.model)
    hw = load_hw(a.hw)
    ok = hold[hold["status"] == "ok"]
    if m.name and set(ok["model_digest"]) - {model_identity(m)[1]}:
        raise GraphsimError("model", f"{a.model} is not the model the held-out samples ran (digest differs)")
    if set(ok["sol_hw_digest"]) - {hw_digest(hw)}:
        raise GraphsimError("hw", f"{a.hw} is not the descriptor the held-out samples' SOL was priced on")
    return m, hw, ViewSpec(a.op_view, a.measured, a.backend or "jax", "older")


def register(sub) -> None:
    from .app import add_command

    p = add_command(sub, "fpm", help="FPM (whole-forward) models: fit samples per partition, evaluate on held-out "
                    "forwards against SOL and OP",
                    description="FPM models (docs/fpm.md): fit whole-forward samples (graphsim collect forward) per "
                                "partition into a\nmodel file for --view fpm, or evaluate a model on held-out "
                                "samples against SOL (and OP with\nmeasured tables).",
                    examples=["graphsim fpm fit samples.parquet -o model.fpm",
                              "graphsim fpm eval model.fpm --holdout heldout.parquet -o report.txt",
                              "graphsim fpm eval model.fpm --holdout heldout.parquet --measured tables --model "
                              "deepseek-v3 --hw local.toml --json"])
    g = p.add_argument_group("what")
    g.add_argument("action", choices=("fit", "eval"),
                   help="fit: samples -> a model file; eval: a model's error on held-out samples")
    g.add_argument("inputs", nargs="*", help="fit: samples files (.parquet); eval: the model file (.fpm)")
    g.add_argument("--holdout", action="append", default=[], metavar="FILE",
                   help="eval: held-out samples (repeatable)")
    g = p.add_argument_group("OP column (eval)", "price the held-out forwards with measured tables too")
    g.add_argument("--measured", default=None, metavar="DIR",
                   help="eval: measured operator tables (graphsim collect ops) for the OP column")
    g.add_argument("--backend", default="", metavar="FRAMEWORK[@VERSION]",
                   help="eval: the tables' FRAMEWORK[@VERSION] (default jax)")
    g.add_argument("--op-view", default="hybrid", choices=("op", "hybrid"),
                   help="eval: the OP column's view (hybrid prices ops no table covers at a + b x SOL)")
    g.add_argument("--model", default=None, help="eval: the model the samples ran (for the OP column)")
    g.add_argument("--hw", default=None, help="eval: the descriptor the samples' SOL used (for the OP column)")
    g = p.add_argument_group("output")
    g.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="fit: the model file to write; eval: write the report here instead of printing it")
    g.add_argument("--json", action="store_true", help="print the fitted model / the evaluation report as JSON")
    p.set_defaults(fn=cmd_fpm)
