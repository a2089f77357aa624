"""``attention`` and ``attention+backward``: the attention core alone on fresh (B, H, N, D)
inputs, forward or forward + backward, checked against the float64 reference on the same
inputs and mask (:mod:`.attention_case`, :mod:`.checking`).

Rows carry the call's compulsory bytes and ``bw_fraction``, those bytes over the median time as
a fraction of the measured copy bandwidth (the figure that says how near its floor a
memory-bound call runs: a small window, a few query rows).

Its one setting is ``qk_std``: the standard deviation q and k are drawn with (v is always
N(0, 1)). Approximate methods are judged by it: FAVOR+'s estimator variance grows like
exp(|q|²/√D).
"""

from harness.columns import BANDWIDTH, Column, point_column

COLUMNS = (
    point_column(
        "qk_std", "", "number",
        "attention scenarios: the standard deviation q and k are drawn with (v: 1); every "
        "implementation and the float64 reference see the same inputs",
    ),
    Column(
        "approx_err", "", "error",
        "attention scenarios, approximations (linear, performer, linformer, nystrom): relative "
        "Frobenius error of the output against exact softmax attention with the same mask, in "
        "float64, on the checked rows; measured, not gated (agreement is against the method's "
        "own float64 definition)",
    ),
    Column(
        "compulsory_bytes", "B", "bytes",
        "attention scenarios: bytes the call must move at least once: q, k, v read and out "
        "written; with backward the row lse written, then q, k, v, out, dout and lse read and "
        "dq, dk, dv written (`harness.cost.components.attention_bytes`)",
    ),
    *BANDWIDTH,
)  # fmt: skip
