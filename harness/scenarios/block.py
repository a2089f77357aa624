"""``block`` and ``block+backward``: the common transformer block with the plugged core.

Rows add the mixer's own time on the same shapes (``mixer_time_s``) and its share of the
block's time (``attn_share`` for attention cores, ``mixer_share`` for every mixer).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from harness.model.transformer import BlockConfig, TransformerBlock, build_block
from harness.oracle.agreement import grad_agreement, output_agreement
from harness.oracle.reference import reference_attention
from harness.scenarios.base import Case, CheckPlan


def block_config(point) -> BlockConfig:
    return BlockConfig(
        heads=point.heads,
        head_dim=point.head_dim,
        kv_heads=point.kv_heads,
        norm=point.norm,
        ffn=point.ffn,
        pos=point.pos,
        mixer=point.mixer,
        conv_kernel=point.conv_kernel,
        causal=point.causal,
        max_len=point.seq_len,
    )


def build(point, impl, device, plan: CheckPlan) -> Case:
    """x: (B, N, d_model) through one block; impl is None for the lstm/conv mixers."""
    block = build_block(block_config(point), point.seed, point.device, point.torch_dtype).eval()
    core = impl.prepare(point.problem()) if impl is not None else None
    gen = torch.Generator(device=point.device).manual_seed(point.seed + 1)
    shape = (point.batch, point.seq_len, point.d_model)
    x = torch.randn(shape, generator=gen, device=point.device, dtype=point.torch_dtype)
    params = [p for p in block.parameters() if p.requires_grad]
    grad_out = torch.randn(shape, generator=gen, device=point.device, dtype=point.torch_dtype)
    if point.backward:
        x.requires_grad_(True)

        def run() -> tuple[Tensor, ...]:
            return torch.autograd.grad(block(x, core), [x, *params], grad_out)
    else:

        def run() -> Tensor:
            with torch.no_grad():
                return block(x, core)

    def check() -> dict:
        return check_block(block, core, x, grad_out, point, plan)

    def extra(measurement, timer) -> dict:
        mixer_fn = mixer_call(block, core, x, grad_out, point.backward)
        mixer_time = timer(mixer_fn).median
        share = mixer_time / measurement.median
        out = {"mixer_time_s": mixer_time, "mixer_share": share}
        if point.mixer == "attention":
            out["attn_share"] = share
        return out

    return Case(
        run=run,
        tokens=point.batch * point.seq_len,
        check=check,
        extra=extra,
        columns={"check": plan.describe()},
    )


def mixer_call(block: TransformerBlock, core, x: Tensor, grad_out: Tensor, backward: bool):
    """A zero-argument call of the block's mixer alone on the shapes it sees inside the block."""
    positions = torch.arange(x.shape[1], device=x.device)
    with torch.no_grad():
        h = block.ln1(block.embed(x))
    if block.cfg.mixer == "attention":
        q, k, v = (t.detach().requires_grad_(backward) for t in block.mixer.project(h, positions))
        if backward:
            core_grad = torch.randn_like(q)  # (B, H, N, D), the core's output shape
            return lambda: torch.autograd.grad(core(q, k, v), (q, k, v), core_grad)

        def attend() -> Tensor:
            with torch.no_grad():
                return core(q, k, v)

        return attend
    h = h.detach().requires_grad_(backward)
    if backward:
        return lambda: torch.autograd.grad(block.mix(h, None, positions), (h,), grad_out)

    def mix() -> Tensor:
        with torch.no_grad():
            return block.mix(h, None, positions)

    return mix


def check_block(
    block: TransformerBlock, core, x: Tensor, grad_out: Tensor, point, plan: CheckPlan
) -> dict:
    """Block output (and dx) against a float64 copy with the float64 reference core."""
    if plan.mode == "none":
        return {"agree": None}
    ref_block = copy.deepcopy(block).double()
    mask = point.mask

    def ref_core(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return reference_attention(q, k, v, mask)

    x64 = x.detach().double().requires_grad_(plan.grads)
    with torch.set_grad_enabled(plan.grads):
        ref = ref_block(x64, ref_core if core is not None else None)
    with torch.no_grad():
        out = block(x.detach(), core)
    result = output_agreement(out, ref.detach(), point.torch_dtype)
    if plan.grads:
        x_grad = x.detach().requires_grad_(True)
        (dx,) = torch.autograd.grad(block(x_grad, core), (x_grad,), grad_out)
        (dx_ref,) = torch.autograd.grad(ref, (x64,), grad_out.double())
        result.update(grad_agreement((dx,), (dx_ref,), point.torch_dtype))
        result["agree"] = result["agree"] and result["grad_agree"]
    return result
