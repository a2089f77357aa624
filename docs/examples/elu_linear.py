"""A plug-in in one file (README: Writing a plug-in):

    attnbench run docs/examples/elu_linear.toml --plugin docs/examples/elu_linear.py
"""

import torch

from harness.registry import register
from harness.spec import Capabilities, Cost


def phi(x):  # the feature map elu(x) + 1 of Katharopoulos et al. (2020)
    return torch.nn.functional.elu(x) + 1


def reference(q, k, v, mask, rows=None, **params):
    """Its definition written out (weights phi(q_i).phi(k_j), normalised per row), for the rows
    asked, in the inputs' dtype: the harness passes float64 inputs for the oracle."""
    w = phi(q if rows is None else q[:, :, rows]) @ phi(k).transpose(-1, -2)  # (B, H, rows, n)
    return (w / w.sum(-1, keepdim=True)) @ v


@register("elu-linear", family="example", reference=reference,
          caps=Capabilities(devices={"cpu", "cuda"}, mask_features=set()),
          cost=Cost(time_exponent=1, memory_exponent=1))
def elu_linear(q, k, v, mask, scale=None):
    """Linear attention in O(n): q, k, v (B, H, n, D) -> (B, H, n, D)."""
    kv = phi(k).transpose(-1, -2) @ v  # (B, H, D, D)
    z = phi(q) @ phi(k).sum(-2, keepdim=True).transpose(-1, -2)  # (B, H, n, 1)
    return (phi(q) @ kv) / z
