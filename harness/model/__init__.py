"""The model the block and decode scenarios time: the common transformer block
(:mod:`harness.model.transformer`). The words its layout understands are declared here, where
the scenarios' settings read them without importing torch."""

NORMS = ("pre", "post")
FFNS = ("relu", "gelu", "swiglu")
POSITIONS = ("sinusoidal", "learned", "rope")
MIXERS = ("attention", "lstm", "conv")
