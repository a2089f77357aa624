"""A run against a baseline: thresholds, noise, findings and the committed baselines."""
