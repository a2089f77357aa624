"""From rows to conclusions: frames, exponent fits, claims and their verdicts."""
