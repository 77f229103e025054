"""Plots: one colour per op kind, axis labels with units, legends outside the axes and inside the picture, the
Pareto plot's colour / marker series (a sweep table and a `graphsim search`-shaped one), the plot command."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgb, to_rgba

from graphsim.exports import plots as P


@pytest.fixture(scope="module")
def sweep():
    """A small sweep: two profiles x two mappings x batch x context, with stage and kind times."""
    from graphsim.sweep import run

    spec = {"outputs": ["stages", "kinds"],
            "structure": {"model": "deepseek-v3", "hw": "gb200", "profile": ["sol", "practitioner"],
                          "mapping": [{"tp": 4, "ep": 4}, {"tp": 8, "ep": 8}], "requests": ["decode"]},
            "axes": {"decode.count": [8, 64, 512], "decode.context": [1024, 8192, 65536]}}
    df = run(spec).to_pandas()
    assert df["profile"].nunique() == 2 and df["mapping"].nunique() == 2
    return df


@pytest.fixture(scope="module")
def search():
    """A table shaped like `graphsim search` results: no sweep inputs, identity or fits columns."""
    rng = np.random.default_rng(0)
    n = 60
    df = pd.DataFrame({"tokens_per_s_per_user": rng.uniform(5, 200, n),
                       "tokens_per_s_per_gpu": rng.uniform(1e2, 5e4, n),
                       "mode": np.where(np.arange(n) % 2, "agg", "disagg"),
                       "mapping": [f"tp{2 ** (i % 3)}-dp1-ep1-pp1" for i in range(n)],
                       "profile": "sol", "view": "sol", "policies": "decoder_replay=off"})
    df["pareto"] = False
    return df


def _close(fig):
    import matplotlib.pyplot as plt

    plt.close(fig)


# ---- one colour per op kind -------------------------------------------------------------------------

def test_every_op_kind_has_its_own_colour():
    assert len(set(P.PALETTE)) == len(P.PALETTE) >= 20 and len(P.PALETTE) > len(P.OP_KINDS)
    assert len(set(P.OP_KINDS)) == len(P.OP_KINDS)
    assert set(P.KIND_COLOURS) == set(P.OP_KINDS)
    # pairwise distinct, and far enough apart to tell (RGB distance; 1 = black to white along one channel)
    for a, b in itertools.combinations(P.PALETTE, 2):
        assert np.linalg.norm(np.subtract(to_rgb(a), to_rgb(b))) > 0.14, (a, b)
    # fixed by the registry's order, not by a plot's contents; an unlisted kind gets a spare, the same each call
    assert [P.kind_colour(k) for k in P.OP_KINDS] == list(P.PALETTE[:len(P.OP_KINDS)])
    assert P.kind_colour("brand_new_kind") == P.kind_colour("brand_new_kind") in P.PALETTE[len(P.OP_KINDS):]


def test_op_kinds_cover_the_kinds_the_models_emit():
    import graphsim as gs
    from graphsim.driver.pipeline import Policies

    hw = gs.load_hw("gb300")
    cases = [("deepseek-v3", ["decode:4096x8"], {"mtp": 1, "acceptance": (0.8,)}),
             ("deepseek-v4.1-flash", ["prefill:4096@2048", "decode:4096x8"],
              {"engram": "host", "dspark": "on", "acceptance": (0.8, 0.7, 0.6, 0.5, 0.4)}),
             ("deepseek-v4-flash", ["prefill:2048", "decode:4096x8"], {}),
             ("llama-3.1-70b", ["prefill:2048", "decode:4096x8"], {}),
             ("graphsim/configs/hf/Qwen--Qwen3.5-27B_config.json", ["prefill:2048", "decode:4096x8"], {})]
    seen = set()
    for model, requests, policies in cases:
        plan = gs.Plan(requests, gs.ParallelMapping(tp=4), policies=Policies(**policies))
        seen |= {op.kind for op in gs.compile_plan(gs.load_model(model), plan, hw).graph.ops}
    assert len(seen) >= 18
    assert seen <= set(P.OP_KINDS), sorted(seen - set(P.OP_KINDS))


def _bar_colours(fig) -> dict:
    ax = fig.axes[0]
    return {c.get_label(): c.patches[0].get_facecolor() for c in ax.containers}


def test_a_kind_keeps_its_colour_whatever_else_a_plot_shows():
    one = SimpleNamespace(identity={"model": "m", "mapping": "tp1"}, breakdown={"gemm": 3.0, "norm": 1.0})
    other = SimpleNamespace(identity={"model": "m", "mapping": "tp1"},
                            breakdown={"attention": 5.0, "collective": 4.0, "norm": 2.0, "gemm": 1.0})
    a, b = P.plot_kinds(one, None), P.plot_kinds(other, None)
    ca, cb = _bar_colours(a), _bar_colours(b)
    assert ca["norm"] == cb["norm"] == to_rgba(P.kind_colour("norm"))
    assert ca["gemm"] == cb["gemm"] == to_rgba(P.kind_colour("gemm"))
    assert len(set(cb.values())) == 4
    _close(a), _close(b)


def test_roofline_dots_take_their_kinds_colour(v41_schedule):
    fig = P.plot_roofline(v41_schedule, None)
    dots = {c.get_label(): c for c in fig.axes[0].collections}
    assert "gemm" in dots and "moe_experts" in dots
    for kind, c in dots.items():
        assert tuple(c.get_facecolor()[0][:3]) == pytest.approx(to_rgb(P.kind_colour(kind)))
    assert fig.axes[0].get_ylabel() == "achieved TFLOP/s"
    _close(fig)


@pytest.fixture(scope="module")
def v41_schedule():
    import graphsim as gs

    c = gs.compile_plan(gs.load_model("deepseek-v4.1-flash"), gs.Plan(["decode:4096x8"], gs.ParallelMapping(tp=4)),
                        gs.load_hw("gb300"))
    return c.schedule()


# ---- axis labels with units -------------------------------------------------------------------------

def test_axis_labels_and_scales():
    assert P.axis("forward_s") == ("forward time (ms)", 1e3)
    assert P.axis("ttft_s") == ("TTFT (ms)", 1e3)
    assert P.axis("itl_s")[0].startswith("ITL / TPOT (ms")
    assert P.axis("tokens_per_s_per_gpu") == ("tokens/s per GPU", 1.0)
    assert P.axis("tokens_per_s_per_user") == ("tokens/s per user", 1.0)
    assert "GiB" in P.axis("total_gib")[0] and "GiB" in P.axis("kv_gib")[0]
    assert P.axis("decode.context") == ("context (tokens)", 1.0)
    assert P.axis("g1.context") == ("g1 context (tokens)", 1.0)
    assert P.axis("prefill.count") == ("prefill requests", 1.0)
    assert P.axis("hw.hbm_bw") == ("HBM bandwidth (TB/s)", 1e-12)
    assert P.axis("hw.hbm_capacity_bytes") == ("HBM capacity (GiB)", 2.0**-30)
    assert P.axis("hw.peak_flops.fp8") == ("fp8 peak (PFLOP/s)", 1e-15)
    assert P.axis("profile.op_overhead_s") == ("per-op overhead (µs)", 1e6)
    assert P.axis("stage_s.decoder") == ("decoder stage time (ms)", 1e3)
    assert P.axis("some_new_column") == ("some_new_column", 1.0)  # unknown: its own name, unscaled
    # every token and memory column a sweep writes has a unit
    from graphsim.sweep.spec import MEMORY_COLUMNS, TOKEN_COLUMNS

    for c in (*TOKEN_COLUMNS, *MEMORY_COLUMNS):
        assert c == "fits" or c in P.AXES, c


def test_plots_label_axes_with_units_and_draw_values_in_them(sweep):
    fig = P.plot_latency(sweep, None, where="profile == 'SOL' and mapping == 'tp4-dp1-ep4-pp1' and decode.count == 8")
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("context (tokens)", "forward time (ms)")
    line = next(ln for ln in ax.get_lines() if ln.get_label() == "forward (critical path)")
    d = sweep.query("profile == 'SOL' and mapping == 'tp4-dp1-ep4-pp1' and `decode.count` == 8").sort_values(
        "decode.context")
    np.testing.assert_allclose(line.get_ydata(), d["forward_s"] * 1e3, rtol=1e-12)  # seconds drawn as ms
    _close(fig)
    fig = P.plot_pareto(sweep, None)
    assert (fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()) == ("tokens/s per user", "tokens/s per GPU")
    _close(fig)
    fig = P.plot_memory(sweep, None)
    assert fig.axes[0].get_ylabel() == "memory per device (GiB)"
    _close(fig)


# ---- legends outside the axes, inside the picture ---------------------------------------------------

@pytest.mark.parametrize("kind", ["latency", "pareto", "kinds", "memory", "roofline"])
def test_legends_sit_outside_the_axes_and_inside_the_figure(sweep, v41_schedule, kind, tmp_path):
    fig = P.plot_roofline(v41_schedule, None) if kind == "roofline" else P.PLOTS[kind](sweep, None)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame, axes = fig.bbox, fig.axes[0].get_window_extent(renderer)
    assert fig.legends, "a titled figure legend"
    for leg in fig.legends:
        box = leg.get_window_extent(renderer)
        assert leg.get_title().get_text()
        assert box.x0 >= frame.x0 - 1 and box.y0 >= frame.y0 - 1 and box.x1 <= frame.x1 + 1 and box.y1 <= frame.y1 + 1
        assert not box.overlaps(axes), "the legend covers no data"
        tight = fig.get_tightbbox(renderer)  # what bbox_inches="tight" saves (inches)
        assert tight.x1 * fig.dpi >= box.x1 - 1 and tight.y1 * fig.dpi >= box.y1 - 1
    _close(fig)
    out = P.plot_roofline(v41_schedule, tmp_path / "p.png") if kind == "roofline" else P.PLOTS[kind](
        sweep, tmp_path / "p.png")
    assert open(out, "rb").read(4) == b"\x89PNG"


def test_kinds_legend_titles_the_column_and_lists_every_kind(sweep):
    fig = P.plot_kinds(sweep, None)
    (leg,) = fig.legends
    assert leg.get_title().get_text() == "op kind"
    kinds = {c[len("kind_s."):] for c in sweep.columns if c.startswith("kind_s.") and sweep[c].notna().any()}
    assert {t.get_text() for t in leg.get_texts()} == kinds
    _close(fig)


# ---- Pareto: colour by mapping, marker by profile / view / any column --------------------------------

def _markers(fig) -> set:
    """The distinct marker shapes of the scatter collections that hold points."""
    return {tuple(map(tuple, np.round(c.get_paths()[0].vertices, 3))) for c in fig.axes[0].collections
            if len(c.get_offsets()) and len(c.get_paths())}


def test_pareto_tells_two_profiles_apart(sweep):
    fig = P.plot_pareto(sweep, None)  # marker auto: profile (two values)
    colour, front = fig.legends
    assert colour.get_title().get_text() == "mapping" and front.get_title().get_text() == "profile"
    assert len(colour.get_texts()) == 2
    labels = [t.get_text() for t in front.get_texts()]
    assert labels[0].startswith("SOL (front: ") and labels[1].startswith("practitioner (front: ")
    assert {h.get_marker() for h in front.legend_handles[:2]} == {"o", "s"}
    assert len(_markers(fig)) >= 2 + 1  # two profiles' markers, and the grey crosses of what does not fit
    # one front per profile: the step lines hold each profile's own front
    fits = sweep[sweep["fits"].astype(bool)]
    steps = [ln for ln in fig.axes[0].get_lines() if ln.get_drawstyle().startswith("steps")]
    assert len(steps) == 2
    for ln, prof in zip(steps, ("SOL", "practitioner")):
        want = P.pareto_front(fits[fits["profile"] == prof], "tokens_per_s_per_user", "tokens_per_s_per_gpu")
        np.testing.assert_allclose(ln.get_xdata(), want["tokens_per_s_per_user"], rtol=1e-12)
    _close(fig)
    one = P.plot_pareto(sweep, None, marker=None, where="profile == 'SOL'", title="mine")
    assert one.axes[0].get_title() == "mine"
    assert one.legends[-1].get_title().get_text() == "Pareto front"
    _close(one)


def test_pareto_of_a_search_table(search, tmp_path):
    fig = P.plot_pareto(search, None, marker="mode")
    colour, front = fig.legends
    assert colour.get_title().get_text() == "mapping" and front.get_title().get_text() == "mode"
    assert [t.get_text().split(" ")[0] for t in front.get_texts()] == ["agg", "disagg"]
    assert len(_markers(fig)) == 2
    assert "tokens/s per GPU vs tokens/s per user" in fig.axes[0].get_title()
    _close(fig)
    assert P.plot_pareto(search, tmp_path / "s.svg", marker="mode", color="policies").endswith("s.svg")
    from graphsim.core.errors import GraphsimError

    with pytest.raises(GraphsimError, match="marker: no column 'nope'"):
        P.plot_pareto(search, None, marker="nope")


def test_pareto_minimizes_times():
    # x = ITL: smaller is better, so the front runs from low ITL / low throughput to high ITL / high throughput
    df = pd.DataFrame({"itl_s": [0.01, 0.02, 0.03, 0.02], "tokens_per_s_per_gpu": [100.0, 300.0, 500.0, 200.0]})
    fig = P.plot_pareto(df, None, x="itl_s")
    (step,) = [ln for ln in fig.axes[0].get_lines() if ln.get_drawstyle().startswith("steps")]
    np.testing.assert_allclose(step.get_xdata(), [10.0, 20.0, 30.0])  # ms; the (0.02, 200) point is dominated
    assert step.get_drawstyle() == "steps-post"
    _close(fig)


# ---- the command ------------------------------------------------------------------------------------

def test_plot_command_marker_and_title(sweep, tmp_path, capsys):
    from graphsim.cli import main

    res = tmp_path / "r.parquet"
    sweep.to_parquet(res)
    png = tmp_path / "p.png"
    assert main(["plot", str(res), "--kind", "pareto", "--marker", "profile", "--color", "decode.count",
                 "--title", "two profiles", "-o", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["plot", str(res), "--kind", "pareto", "--marker", "none", "-o", str(png)]) == 0
    assert main(["plot", str(res), "--kind", "pareto", "--marker", "nope", "-o", str(png)]) == 2
    assert "marker: no column 'nope'" in capsys.readouterr().err
    assert main(["plot", str(res), "--kind", "latency", "--marker", "profile", "-o", str(png)]) == 2
    assert "kind: --y, --color and --marker shape the pareto plot" in capsys.readouterr().err


def test_plot_help_follows_the_cli_convention():
    import argparse

    from graphsim.cli.app import build_parser

    sub = next(a for a in build_parser("plot")._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices["plot"]
    assert p.formatter_class is argparse.RawDescriptionHelpFormatter and p.description
    examples = [ln.strip() for ln in p.epilog.splitlines() if ln.strip().startswith("graphsim plot")]
    assert 2 <= len(examples) <= 3
    mine = {"results", "kind", "output", "where", "x", "y", "color", "marker", "title", "request"}
    grouped = {a.dest for g in p._action_groups if g.title not in ("options", "positional arguments")
               for a in g._group_actions}
    for act in p._actions:
        if act.dest in mine:
            assert act.help, act.dest
            assert act.dest in grouped, f"{act.dest} sits in an argument group"


# ---- no silent subset: every varying structural column is a panel, a marker series or a colour ----------

def _two_models():
    """A search-shaped table of two models x two mappings x two profiles (model B's points all dominate A's)."""
    rng = np.random.default_rng(1)
    rows = []
    for model, scale in (("A", 1.0), ("B", 10.0)):
        for mapping in ("tp4-dp1-ep1-pp1", "tp8-dp1-ep1-pp1"):
            for profile in ("SOL", "practitioner"):
                for _ in range(10):
                    rows.append({"model": model, "hw": "gb200", "mapping": mapping, "profile": profile,
                                 "tokens_per_s_per_user": rng.uniform(5, 200) * scale,
                                 "tokens_per_s_per_gpu": rng.uniform(1e2, 5e4) * scale})
    return pd.DataFrame(rows)


def _steps(ax):
    return [ln for ln in ax.get_lines() if ln.get_drawstyle().startswith("steps")]


def test_latency_draws_every_structural_point_in_its_own_panel(sweep):
    notes = []
    fig = P.plot_latency(sweep, None, notes=notes)  # profile x mapping vary: four panels, not the first struct_id
    axes = [ax for ax in fig.axes if ax.get_lines()]
    titles = sorted(ax.get_title() for ax in axes)
    want = sorted(f"profile, mapping: {p}, {m}" for p in ("SOL", "practitioner")
                  for m in ("tp4-dp1-ep4-pp1", "tp8-dp1-ep8-pp1"))
    assert titles == want
    assert "struct_id" not in fig.get_suptitle()
    assert notes == ["fixed at the first value: decode.count=8 (6 of 9 rows not drawn)"]  # said, not silent
    assert notes[0] in fig.get_suptitle()
    _close(fig)


def test_pareto_never_mixes_models_in_one_front():
    df = _two_models()
    notes = []
    fig = P.plot_pareto(df, None, notes=notes)
    axes = [ax for ax in fig.axes if _steps(ax)]
    assert [ax.get_title() for ax in axes] == ["model=A", "model=B"]  # one panel per model
    colour, front = fig.legends
    assert colour.get_title().get_text() == "mapping" and front.get_title().get_text() == "profile"
    for ax, model in zip(axes, "AB"):
        for ln, prof in zip(_steps(ax), ("SOL", "practitioner")):  # one front per profile, within its model
            g = df[(df["model"] == model) & (df["profile"] == prof)]
            want = P.pareto_front(g, "tokens_per_s_per_user", "tokens_per_s_per_gpu")
            np.testing.assert_allclose(ln.get_xdata(), want["tokens_per_s_per_user"], rtol=1e-12)
    assert notes == []
    _close(fig)


def test_pareto_marks_every_varying_estimate_and_colours_every_choice():
    df = _two_models().query("model == 'A'").copy()
    df["view"] = np.where(np.arange(len(df)) % 2, "sol", "op")
    df["overlap"] = np.where(np.arange(len(df)) % 3, "tbo", "off")
    fig = P.plot_pareto(df, None)
    colour, front = fig.legends
    assert front.get_title().get_text() == "profile, view" and len(_steps(fig.axes[0])) == 4
    assert colour.get_title().get_text() == "mapping, overlap" and len(colour.get_texts()) == 4
    assert "A on gb200" in fig.axes[0].get_title()  # what every row shares
    _close(fig)
    notes = []
    fig = P.plot_pareto(df, None, marker=None, color="mapping", notes=notes)  # profiles then get panels
    assert sorted(ax.get_title() for ax in fig.axes if _steps(ax)) == [
        "profile, view: SOL, op", "profile, view: SOL, sol", "profile, view: practitioner, op",
        "profile, view: practitioner, sol"]
    assert notes == ["overlap also varies, shown by neither colour nor marker (one front over them)"]
    _close(fig)


def test_kinds_and_error_rows_say_what_is_left_out(sweep):
    notes = []
    bad = sweep.head(3).assign(error="mapping.tp: boom")
    fig = P.plot_kinds(pd.concat([sweep, bad], ignore_index=True), None, notes=notes)
    assert notes == ["3 error row(s) not drawn", f"the first 8 of {len(sweep)} rows drawn; choose others with "
                     "where / --where"]
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert ticks[0].startswith("SOL tp4-dp1-ep4-pp1 count=8 context=1024"), ticks[0]  # profile and mapping
    assert all(n in fig.axes[0].get_title() for n in notes)
    _close(fig)


def test_plot_command_prints_its_notes(sweep, tmp_path, capsys):
    from graphsim.cli import main

    res = tmp_path / "r.parquet"
    sweep.to_parquet(res)
    assert main(["plot", str(res), "--kind", "latency", "-o", str(tmp_path / "l.png")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["graphsim: note: fixed at the first value: decode.count=8 (6 of 9 rows not drawn)"]


# ---- a results row's roofline: its plan rebuilt from its identity columns ----------------------------

@pytest.fixture(scope="module")
def mixed():
    """Two profiles x two collective algorithms, prefill+decode, with a prefix hit and an HBM bandwidth axis:
    every kind of column a row's plan is rebuilt from."""
    from graphsim.sweep import run

    spec = {"structure": {"model": "llama-3.1-70b", "hw": "gb200", "profile": ["sol", "practitioner"],
                          "mapping": [{"tp": 4}], "requests": ["prefill+decode"],
                          "policies": {"algorithms": [{}, {"all_reduce": "tree"}]}},
            "axes": {"decode.count": [8, 64], "decode.context": [1024, 8192], "prefill.prompt": [2048],
                     "prefill.cached": [0, 1024], "hw.hbm_bw": [6e12, 8e12]}}
    return run(spec).to_pandas()


def test_a_rows_rebuilt_plan_gives_the_rows_forward_time(mixed):
    from graphsim.sweep.rows import row_point, row_schedule

    assert mixed["error"].isna().all()
    for i in range(0, len(mixed), 5):  # every profile, algorithm, bandwidth, prefix and batch combination
        row = mixed.iloc[i].to_dict()
        c, s = row_schedule(row)
        assert s.forward[0] == pytest.approx(row["forward_s"], rel=1e-12), i
        assert [str(r) for r in c.plan.requests][1].startswith(f"decode:{int(row['decode.context'])}x"
                                                               f"{int(row['decode.count'])}")
    tree = mixed[mixed["algorithms"] != "[]"].iloc[0].to_dict()
    assert dict(row_point(tree).policies)["algorithms"] == (("all_reduce", "tree"),)
    plain = {**tree, "algorithms": "[]"}  # the same point under the default algorithm is another plan
    assert row_schedule(plain)[1].forward[0] != pytest.approx(tree["forward_s"], rel=1e-9)


def test_plot_roofline_of_a_results_row(mixed, tmp_path, capsys):
    from graphsim.cli import main

    res = tmp_path / "r.parquet"
    mixed.to_parquet(res)
    png = tmp_path / "roof.png"
    assert main(["plot", str(res), "--kind", "roofline", "--row", "3", "--where", "profile == 'practitioner'",
                 "-o", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    for args, field in ((["--kind", "roofline"], "row: a roofline is one plan's: give --row I"),
                        (["--kind", "roofline", "--row", "64"], "row: the table has 64 row(s); --row is 0..63, got 64"),
                        (["--kind", "latency", "--row", "1"], "row: --row picks the results row")):
        assert main(["plot", str(res), *args, "-o", str(png)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"graphsim: error: {field}"), err
    bad = mixed.head(2).assign(error="mapping.tp: boom")
    bad.to_parquet(res)
    assert main(["plot", str(res), "--kind", "roofline", "--row", "0", "-o", str(png)]) == 2
    assert "row: an error row has no schedule: mapping.tp: boom" in capsys.readouterr().err
