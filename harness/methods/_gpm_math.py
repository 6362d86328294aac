"""GPM and BECAME mathematics: layer representations, energy-threshold bases, gradient
projection, the diagonal Fisher and the closed-form merge coefficient.

Pure tensor code shared by `gpm.py` and `became.py` (underscore: not an adapter module).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PROJECTED_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d)


def energy_threshold(task: int, eps_base: float, eps_step: float) -> float:
    """ε for the 0-based task index: ε_base + ε_step·task (the spec's ε_base + ε_step·(t−1)),
    capped at 1: past 1 (task 12 with the defaults) no energy level satisfies it."""
    return min(1.0, float(eps_base) + float(eps_step) * int(task))


def layer_input_matrix(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer's inputs as columns: (in_features × n) for Linear, im2col patches for Conv1d/Conv2d.

    Conv rows follow `weight.view(C_out, -1)` (C_in major, then kernel rows, then columns),
    which is exactly the channel layout of `F.unfold`; a Conv1d is a Conv2d of height 1.
    """
    if isinstance(layer, nn.Linear):
        return x.reshape(-1, layer.in_features).T
    if isinstance(layer, nn.Conv1d):
        if layer.groups != 1 or layer.padding_mode != "zeros" or isinstance(layer.padding, str):
            raise ValueError(f"GPM: Conv1d with groups={layer.groups}, padding={layer.padding!r}, "
                             f"padding_mode={layer.padding_mode!r} is unsupported; allowed: groups=1, "
                             "integer zero padding")
        cols = F.unfold(x.unsqueeze(2), (1, layer.kernel_size[0]), dilation=(1, layer.dilation[0]),
                        padding=(0, layer.padding[0]), stride=(1, layer.stride[0]))
        return cols.permute(1, 0, 2).reshape(cols.shape[1], -1)
    if isinstance(layer, nn.Conv2d):
        if layer.groups != 1 or layer.padding_mode != "zeros" or isinstance(layer.padding, str):
            raise ValueError(f"GPM: Conv2d with groups={layer.groups}, padding={layer.padding!r}, "
                             f"padding_mode={layer.padding_mode!r} is unsupported; allowed: groups=1, "
                             "integer zero padding")
        cols = F.unfold(x, layer.kernel_size, dilation=layer.dilation, padding=layer.padding,
                        stride=layer.stride)  # (N, C_in*kh*kw, L)
        return cols.permute(1, 0, 2).reshape(cols.shape[1], -1)
    raise TypeError(f"GPM: cannot build a representation for {type(layer).__name__}")


def update_basis_from_gram(basis: torch.Tensor | None, gram: torch.Tensor, eps: float) -> torch.Tensor:
    """GPM memory update from G = R Rᵀ (same result as the SVD of R, in O(d²) memory).

    Left singular vectors of R are the eigenvectors of G, σ² its eigenvalues. With memory
    M, R̂ = (I − MMᵀ)R has Gram PGP. Start from acc = (‖R‖² − ‖R̂‖²)/‖R‖² and add R̂'s
    directions in order of σ̂² while acc < ε (task 1: M empty, acc starts at 0).
    """
    gram = gram.detach().to(torch.float64)
    d = gram.shape[0]
    old = (basis.detach().to(torch.float64).to(gram.device) if basis is not None
           else gram.new_zeros(d, 0))
    total = float(torch.trace(gram))
    if total <= 0 or old.shape[1] >= d:
        return old.to(torch.float32)
    proj = torch.eye(d, dtype=gram.dtype, device=gram.device) - old @ old.T
    resid = proj @ gram @ proj
    sig2, vecs = torch.linalg.eigh((resid + resid.T) / 2)
    sig2, vecs = sig2.flip(0).clamp_min(0), vecs.flip(1)
    acc = (total - float(sig2.sum())) / total
    r = 0
    # Only directions that carry energy: zero-σ̂ eigenvectors are arbitrary and would fill
    # the memory (freezing the layer) whenever acc cannot reach ε through rounding.
    tol = 1e-12 * max(float(sig2.max()), 0.0) if len(sig2) else 0.0
    for s in (sig2 / total).tolist():
        if acc >= eps or r >= d - old.shape[1] or s * total <= tol:
            break
        acc += s
        r += 1
    return _append_orthonormal(old, vecs[:, :r]).to(torch.float32)


def _append_orthonormal(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    # Mathematically a no-op (R̂'s directions are ⊥ M); numerically keeps M orthonormal.
    if new.shape[1] == 0:
        return old
    new = new - old @ (old.T @ new)
    q, _ = torch.linalg.qr(new)
    return torch.cat([old, q], dim=1)


def project_gradient_(weight: torch.Tensor, projector: torch.Tensor) -> None:
    """In place: G ← G − (G.view(C_out, −1) · MMᵀ).view_as(G), `projector` = MMᵀ."""
    grad = weight.grad
    if grad is None:
        return
    flat = grad.view(grad.shape[0], -1)
    grad.sub_((flat @ projector).view_as(grad))


def diag_fisher(model: nn.Module, batches, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Diagonal Fisher: Σ_B |B|·(∇ mean CE(model(x), argmax))² / N over `batches` of (x, task).

    The caller sets the model's mode (the spec: train mode) and keeps its buffers.
    """
    names, tensors = list(params), list(params.values())
    fisher = {n: torch.zeros_like(p) for n, p in params.items()}
    count = 0
    for x, task in batches:
        out = model(x, task)
        loss = F.cross_entropy(out, out.argmax(dim=1).detach())
        grads = torch.autograd.grad(loss, tensors, allow_unused=True)
        for name, grad in zip(names, grads):
            if grad is not None:
                fisher[name].add_(grad.detach().pow(2), alpha=len(x))
        count += len(x)
    return {n: f / max(count, 1) for n, f in fisher.items()}


def closed_form_alpha(f_new: dict, f_old: dict, delta: dict) -> float:
    """α = Σ F_t δ² / Σ (F_t + F_old) δ² over the names of `delta`; 0 when the denominator is 0."""
    num = den = 0.0
    for name, d in delta.items():
        d2 = d.detach().to(torch.float64).pow(2)
        a = float((f_new[name].to(torch.float64) * d2).sum()) if name in f_new else 0.0
        b = float((f_old[name].to(torch.float64) * d2).sum()) if name in f_old else 0.0
        num, den = num + a, den + a + b
    return 0.0 if den <= 0 else min(max(num / den, 0.0), 1.0)


def merge_tensors(gp: torch.Tensor, free: torch.Tensor, alpha: float) -> torch.Tensor:
    """(1−α)·gp + α·free; exact at α ∈ {0, 1} and wherever gp == free (frozen entries stay bitwise)."""
    if not torch.is_floating_point(gp):
        return (gp if alpha < 0.5 else free).clone()
    mixed = (1.0 - alpha) * gp + alpha * free
    return torch.where(gp == free, gp, mixed)
