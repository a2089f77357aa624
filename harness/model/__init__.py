"""The model the block and decode scenarios time: the common transformer block
(:mod:`harness.model.transformer`). The words its layout understands are declared here, where
the scenarios' settings read them without importing torch, with the row columns of the
layout (the block and decode scenarios' settings)."""

from harness.columns import point_column

NORMS = ("pre", "post")
FFNS = ("relu", "gelu", "swiglu")
POSITIONS = ("sinusoidal", "learned", "rope")

# the block's settings (norm, ffn, pos) as row columns; the block and decode scenarios share them
BLOCK_SETTING_COLUMNS = (
    point_column("norm", "", "text", "block and decode scenarios: `pre` or `post` layer norm"),
    point_column(
        "ffn", "", "text",
        "block and decode scenarios: feed-forward kind, `relu`, `gelu` or `swiglu`",
    ),
    point_column(
        "pos", "", "text",
        "block and decode scenarios: position encoding, `sinusoidal`, `learned` or `rope`",
    ),
)  # fmt: skip
