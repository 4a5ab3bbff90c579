"""Benchmarking, in four rooms imported bottom-up: ``harness`` (what every benchmark shares), ``studies``,
``reports`` and ``runners``. Built on the engine and the core; nothing below imports from here.
"""
