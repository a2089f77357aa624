"""The words a suite may use for a point's choice fields and ``[measure]`` modes.

They live here, at the bottom of the layers that read them: the suite validates against them,
and the model and scenarios that give the words their meaning import them from here.
"""

from __future__ import annotations

DEVICES = ("cpu", "cuda", "auto")
# block scenario: the transformer block's layout (harness.model.transformer)
NORMS = ("pre", "post")
FFNS = ("relu", "gelu", "swiglu")
POSITIONS = ("sinusoidal", "learned", "rope")
MIXERS = ("attention", "lstm", "conv")
MIXER_IMPLS = {"lstm", "conv"}  # block-scenario baselines that replace the attention mixer
# decode scenario: the KV cache, and how the timed step is launched (harness.scenarios.decode_step)
CACHES = ("none", "full", "rolling")
GRAPH_MODES = ("auto", "none", "cuda-graph", "compile")
# [measure] check: how much of the output is compared with the float64 reference
CHECK_MODES = ("auto", "full", "rows", "none")
