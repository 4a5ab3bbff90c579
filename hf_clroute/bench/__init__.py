"""The bench: suites, runners, results, reports, plots, probes, model cards and publishing.

Built on the engine and the core; nothing below imports from here.
"""
