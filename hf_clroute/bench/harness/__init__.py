"""What every benchmark shares: suites, settings, feature caches, probes, results, verdicts."""
