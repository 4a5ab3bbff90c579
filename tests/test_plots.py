"""Plots are redrawn from results.json, and only where the results or the plotting code changed."""

from __future__ import annotations

import copy


def test_a_plot_folder_is_redrawn_only_when_its_results_or_the_plotting_code_change(tmp_path, monkeypatch):
    from hf_clroute.bench.reports import plots

    results = {"suite": "tiny", "methods": {"ncm": {"accuracy_matrix": [[0.9, 0.0], [0.7, 0.8]],
                                                   "A_T": {"mean": 0.75, "std": 0.0},
                                                   "per_seed": [{"seed": 0, "A_T": 0.75}]}}}
    out = tmp_path / "plots"
    heatmap = out / "accuracy_matrix_ncm.png"
    assert heatmap in plots.write_plots(results, out)
    heatmap.touch()  # any redraw would move the mtime again
    touched = heatmap.stat().st_mtime_ns
    assert heatmap in plots.write_plots(copy.deepcopy(results), out) and heatmap.stat().st_mtime_ns == touched

    changed = copy.deepcopy(results)
    changed["methods"]["ncm"]["accuracy_matrix"][1][0] = 0.6  # new results: redrawn
    calls = []
    real = plots.accuracy_heatmap
    monkeypatch.setattr(plots, "accuracy_heatmap", lambda *a: calls.append(a[0]) or real(*a))
    plots.write_plots(changed, out)
    assert calls == ["ncm"]
    plots.write_plots(changed, out)
    assert calls == ["ncm"]  # drawn from these results already
    heatmap.unlink()  # a missing plot is drawn again, whatever the stamp says
    plots.write_plots(changed, out)
    assert calls == ["ncm", "ncm"] and heatmap.is_file()
    monkeypatch.setattr(plots, "drawn_from", lambda r: "another version of the plotting code")
    plots.write_plots(changed, out)
    assert calls == ["ncm", "ncm", "ncm"]
