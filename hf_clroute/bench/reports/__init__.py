"""Reports: BENCHMARKS.md, plots, model cards, speed tables."""
