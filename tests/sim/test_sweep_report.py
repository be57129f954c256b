"""Sweeps (parallel = inline), reports (tables, JSON, CSV) and plots."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from kvoffload.sim.capacity import parse_capacities
from kvoffload.sim.replay import PolicySpec, ReplayOptions, ReplayResult
from kvoffload.sim.report import bounds_table, dump_json, results_table, write_results_csv
from kvoffload.sim.sweep import SweepResult, run_sweep
from kvoffload.sim.workloads import WorkloadConfig, generate_workload

TRACE = generate_workload(WorkloadConfig(requests=250))
POLICIES = [PolicySpec("lru"), PolicySpec("arc")]
CAPACITIES = parse_capacities("2%,10%", TRACE.num_unique_blocks, TRACE.block_tokens)


def essentials(result: ReplayResult) -> tuple[object, ...]:
    d = result.to_dict()
    return (
        d["policy"],
        d["capacity_blocks"],
        d["block_hits"],
        d["prefix_hit_blocks"],
        d["evictions"],
    )


@pytest.fixture(scope="module")
def inline() -> SweepResult:
    return run_sweep(TRACE, POLICIES, CAPACITIES, ReplayOptions(), workers=1)


def test_parallel_sweep_equals_inline_and_keeps_order(inline: SweepResult) -> None:
    done: list[str] = []
    started: list[int] = []
    parallel = run_sweep(
        TRACE,
        POLICIES,
        CAPACITIES,
        ReplayOptions(),
        workers=2,
        on_task_done=done.append,
        on_started=started.append,
    )
    assert [essentials(r) for r in parallel.results] == [essentials(r) for r in inline.results]
    assert [(r.policy, r.capacity_label) for r in parallel.results] == [
        ("lru", "2%"),
        ("arc", "2%"),
        ("lru", "10%"),
        ("arc", "10%"),
    ]
    assert parallel.bounds == inline.bounds
    assert started == [6] and sorted(done) == sorted(
        ["bounds @ 2%", "bounds @ 10%", "lru @ 2%", "arc @ 2%", "lru @ 10%", "arc @ 10%"]
    )


def test_worker_errors_reach_the_caller() -> None:
    with pytest.raises(ValueError, match="Unknown cache policy"):
        run_sweep(
            TRACE,
            [PolicySpec("no-such-policy"), PolicySpec("lru")],
            CAPACITIES,
            ReplayOptions(),
            with_bounds=False,
            workers=2,
        )


def test_tables_render_every_row(inline: SweepResult) -> None:
    from rich.console import Console

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(results_table(inline.results, inline.bounds))
    text = console.export_text()
    for label in ("lru", "arc", "Belady MIN", "OPT (bypass)", "infinite cache", "capacity 2% = "):
        assert label in text
    console.print(bounds_table(inline.bounds, ["2%", "10%"]))
    assert "max live" in console.export_text()


def test_csv_and_json_outputs(inline: SweepResult) -> None:
    out = io.StringIO()
    write_results_csv(inline.results, inline.bounds, out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert len(rows) == 4
    first = rows[0]
    assert first["policy"] == "lru" and float(first["block_hit_ratio"]) >= 0
    assert "belady_hit_ratio" in first and "hit_length_p90" in first
    assert float(first["belady_hit_ratio"]) >= float(first["block_hit_ratio"])
    text = io.StringIO()
    dump_json({"results": [r.to_dict() for r in inline.results]}, text)
    assert len(json.loads(text.getvalue())["results"]) == 4


def test_plots_are_written(inline: SweepResult, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from kvoffload.sim.report.plot import plot_capacity_bars, plot_hit_ratio_curves

    curve = plot_hit_ratio_curves(inline.results, inline.bounds, tmp_path / "mrc.png")
    bars = plot_capacity_bars(inline.results, inline.bounds, tmp_path)
    assert curve.stat().st_size > 1000
    assert len(bars) == 2 and all(p.stat().st_size > 1000 for p in bars)


def test_plot_files_are_named_by_the_capacity_asked_for(
    inline: SweepResult, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    from kvoffload.sim.report.plot import capacity_file_name, plot_capacity_bars

    bars = plot_capacity_bars(inline.results, inline.bounds, tmp_path)
    assert [p.name for p in bars] == ["bars_2pct.png", "bars_10pct.png"]
    assert capacity_file_name("4Mtok") == "bars_4Mtok.png"
    assert capacity_file_name("8 GiB") == "bars_8_GiB.png"
    assert "/" not in capacity_file_name("../x")


def test_every_builtin_policy_gets_its_own_look() -> None:
    from kvoffload.policies import BUILTIN_POLICIES
    from kvoffload.sim.report.plot import policy_style

    n = len(BUILTIN_POLICIES)
    looks = [tuple(sorted(policy_style(i).items())) for i in range(n)]
    assert len(set(looks)) == len(looks) == n
    pairs = [(policy_style(i)["marker"], policy_style(i)["linestyle"]) for i in range(n)]
    assert len(set(pairs)) == n  # distinguishable even without colour


def test_belady_is_visible_and_named_when_it_equals_opt(
    inline: SweepResult, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from kvoffload.sim.report import plot

    drawn: list[dict[str, object]] = []
    real_plot = plt.Axes.plot

    def spy(self: object, *args: object, **kwargs: object) -> object:
        drawn.append(kwargs)
        return real_plot(self, *args, **kwargs)  # type: ignore[arg-type]

    equal = [
        type(b)(**{**b.to_dict(), "belady_prefix_hit_ratio": b.opt_bypass_prefix_hit_ratio})
        for b in inline.bounds
    ]
    try:
        plt.Axes.plot = spy  # type: ignore[method-assign]
        plot.plot_hit_ratio_curves(inline.results, equal, tmp_path / "c.png")
    finally:
        plt.Axes.plot = real_plot  # type: ignore[method-assign]
    by_label = {d["label"]: d for d in drawn}
    belady, opt = by_label["Belady MIN (= OPT here)"], by_label["OPT (bypass)"]
    assert opt["linewidth"] > 3 * belady["linewidth"]  # a band under a thin line: both show
    assert belady["color"] != opt["color"]


def _result(policy: str, capacity: int, prefix_hits: int) -> ReplayResult:
    """A replay result with the given prefix hits out of 1,000 accesses (for chart layout)."""
    (base,) = run_sweep(
        TRACE, [PolicySpec("lru")], CAPACITIES[:1], ReplayOptions(), with_bounds=False
    ).results
    d = {f.name: getattr(base, f.name) for f in base.__dataclass_fields__.values()}
    d.update(
        policy=policy,
        capacity_blocks=capacity,
        block_accesses=1000,
        block_hits=prefix_hits,
        prefix_hit_blocks=prefix_hits,
    )
    return ReplayResult(**d)


def test_the_default_curve_draws_the_best_few_and_lru_as_hit_ratios(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from kvoffload.sim.report import plot

    hits = {"lru": 100, "a": 150, "b": 140, "c": 130, "d": 120, "e": 110, "f": 90}
    results = [_result(p, cap, h + cap) for cap in (10, 50) for p, h in hits.items()]
    assert plot.curve_policies(results) == ["a", "b", "c", "d", "lru"]
    assert plot.curve_policies(results, top=None) == ["a", "b", "c", "d", "e", "lru", "f"]
    drawn: list[tuple[tuple[object, ...], dict[str, object]]] = []
    real_plot = plt.Axes.plot

    def spy(self: object, *args: object, **kwargs: object) -> object:
        drawn.append((args, kwargs))
        return real_plot(self, *args, **kwargs)  # type: ignore[arg-type]

    try:
        plt.Axes.plot = spy  # type: ignore[method-assign]
        plot.plot_hit_ratio_curves(results, [], tmp_path / "c.png")
    finally:
        plt.Axes.plot = real_plot  # type: ignore[method-assign]
    lines = {str(kw["label"]): (args, kw) for args, kw in drawn}
    assert list(lines) == ["a", "b", "c", "d", "lru (baseline)"]
    (_, ys), _ = lines["a"]
    assert list(ys) == [0.16, 0.2]  # hit ratios, as the tables show (not 1 - hit ratio)
    looks = {(kw["color"], kw["marker"], kw["linestyle"]) for _, kw in lines.values()}
    assert len(looks) == 5  # every line its own style
    assert len({kw["color"] for _, kw in lines.values()}) == 5  # and its own colour


def test_a_curve_equal_to_another_says_so_and_stays_visible(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from kvoffload.sim.report import plot

    results = [
        _result(p, cap, h + cap)
        for cap in (10, 50)
        for p, h in {"lru": 100, "mq": 150, "auto": 150}.items()
    ]
    labels: list[object] = []
    real_plot = plt.Axes.plot

    def spy(self: object, *args: object, **kwargs: object) -> object:
        labels.append((kwargs["label"], kwargs.get("markerfacecolor")))
        return real_plot(self, *args, **kwargs)  # type: ignore[arg-type]

    try:
        plt.Axes.plot = spy  # type: ignore[method-assign]
        plot.plot_hit_ratio_curves(results, [], tmp_path / "c.png")
    finally:
        plt.Axes.plot = real_plot  # type: ignore[method-assign]
    assert ("auto (= mq here)", "none") in labels  # hollow, over the line it hides


def test_bar_charts_are_sorted_and_their_axis_shows_the_differences(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from kvoffload.sim.report import plot

    values = {"lru": 156, "a": 210, "b": 202, "c": 186, "d": 170, "sae": 43}
    results = [_result(p, 10, h) for p, h in values.items()]
    low, high = plot.bar_axis([v / 1000 for v in values.values()], baseline=0.156)
    assert 0.1 < low < 0.156 and 0.21 < high < 0.25  # not 0 to the infinite cache
    assert plot.bar_axis([0.5, 0.5]) == pytest.approx((0.47, 0.515))  # equal values: a range
    seen: list[tuple[list[str], tuple[float, float]]] = []
    real_savefig = plt.Figure.savefig

    def savefig(self: plt.Figure, *args: object, **kw: object) -> object:
        ax = self.axes[0]
        seen.append(([t.get_text() for t in ax.get_yticklabels()], ax.get_xlim()))
        return real_savefig(self, *args, **kw)  # type: ignore[arg-type]

    try:
        plt.Figure.savefig = savefig  # type: ignore[method-assign]
        plot.plot_capacity_bars(results, [], tmp_path)
    finally:
        plt.Figure.savefig = real_savefig  # type: ignore[method-assign]
    ((labels, limits),) = seen
    assert labels == ["a", "b", "c", "d", "lru", "sae"]  # best first, from the top
    assert limits == pytest.approx((low, high))
