"""``block`` and ``block+backward``: the common transformer block (:mod:`harness.model`) with the
attention core plugged in, or an LSTM / convolution mixer in its place as a baseline
(:mod:`.block_case`). Rows add the mixer timed alone on the same shapes and its share of the
block's time.
"""

from harness.columns import Column, point_column
from harness.model import BLOCK_SETTING_COLUMNS

BASELINES = {"lstm": "recurrent", "conv": "convolution"}  # implementation -> family
COLUMNS = (
    *BLOCK_SETTING_COLUMNS,
    point_column(
        "mixer", "", "text", "block scenario: `attention`, or the `lstm` / `conv` baseline",
        follows_impl=True,
    ),
    point_column(
        "conv_kernel", "tokens", "int", "block scenario: kernel width of the `conv` mixer"
    ),
    Column(
        "attn_share", "", "share",
        "block scenario with the attention mixer: attention's share of block time",
        title="attention share of block time",
    ),
    Column(
        "mixer_time_s", "s", "seconds", "block scenario: the mixer timed alone on the same shapes",
        title="mixer time", timed=True,
    ),
    Column(
        "mixer_share", "", "share", "block scenario: the mixer's share of block time",
        title="mixer share of block time",
    ),
)  # fmt: skip
