"""torch graph wrappers for Qwen2.5-VL (export time only: this module imports torch at import).

QwenVisionGraph runs HF's own vision submodules (patch embedding, axial rotary embedding, blocks' norms,
qkv/proj linears and MLPs, patch merger) with the data-dependent parts supplied as tensors
(coverpruner.families.qwen2_5_vl.vision), so the ONNX graph has no Loop over windows and any grid within the
limits runs through the same graph: window blocks gather the patches into W windows padded to S slots and
run one batched attention [W, H, S, S] with the padding keys masked (cost W*S^2, ~N*S, instead of N^2);
full-attention blocks run one attention over all N patches with a block-diagonal mask built from segment
ids. Scores and softmax are float32 (as HF's eager path).
"""

from __future__ import annotations

import torch
from torch import nn


def _block_mask(seg: torch.Tensor) -> torch.Tensor:
    """float32 [N, N] additive mask: 0 where segment ids match, float32 min elsewhere (block-diagonal)."""
    same = seg[:, None] == seg[None, :]
    return torch.where(same, torch.zeros((), dtype=torch.float32),
                       torch.full((), torch.finfo(torch.float32).min, dtype=torch.float32))


class QwenVisionGraph(nn.Module):
    """Qwen2.5-VL vision tower + merger -> visual tokens in native order.

    Inputs: pixel_values [N, C*T*P*P] (processor order, model dtype), vision_position_ids int64 [N, 2],
    window_index int64 [n], window_inverse int64 [n], window_gather int64 [W, S], window_lengths int64 [W],
    window_scatter int64 [N], full_segments int64 [N] (see vision.py). Output: image_features [n, d_text] (model dtype) == HF
    `get_image_features(...).pooler_output` for the image.
    """

    def __init__(self, visual):
        super().__init__()
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision

        self.visual = visual
        self.apply_rope = apply_rotary_pos_emb_vision
        self.unit = visual.spatial_merge_size ** 2
        self.full_blocks = set(int(i) for i in visual.fullatt_block_indexes)

    def _to_window_order(self, x: torch.Tensor, window_index: torch.Tensor) -> torch.Tensor:
        n_patches, width = x.shape
        return x.reshape(-1, self.unit, width).index_select(0, window_index).reshape(n_patches, width)

    def _qkv(self, attn, x, cos, sin):
        """x [..., P, C] -> q, k, v [..., H, P, hd] with the vision rotary applied (float32 inside, as HF)."""
        q, k, v = attn.qkv(x).unflatten(-1, (3, attn.num_heads, -1)).unbind(-3)  # [..., P, H, hd]
        q, k = self.apply_rope(q, k, cos, sin)
        return q.transpose(-2, -3), k.transpose(-2, -3), v.transpose(-2, -3)

    @staticmethod
    def _attend(attn, q, k, v, mask):
        """softmax(q k^T * scale + mask) v in float32 scores; [..., H, P, hd] -> [..., P, H*hd]."""
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * attn.scaling + mask
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return torch.matmul(probs, v).transpose(-2, -3).flatten(-2)

    def _full_attention(self, attn, x, cos, sin, mask):
        q, k, v = self._qkv(attn, x, cos, sin)
        return attn.proj(self._attend(attn, q, k, v, mask))

    def _window_attention(self, attn, x, cos, sin, gather, key_mask, scatter):
        """x [N, C] (window order) -> [N, C]: attention inside each window, windows batched and padded."""
        slots = gather.shape[1]
        xw, cw, sw = (t.index_select(0, gather.reshape(-1)).unflatten(0, (-1, slots)) for t in (x, cos, sin))
        q, k, v = self._qkv(attn, xw, cw, sw)  # [W, H, S, hd]
        out = self._attend(attn, q, k, v, key_mask)  # [W, S, C]
        return attn.proj(out.flatten(0, 1).index_select(0, scatter))

    def forward(self, pixel_values, vision_position_ids, window_index, window_inverse, window_gather,
                window_lengths, window_scatter, full_segments):
        vis = self.visual
        x = vis.patch_embed(pixel_values)
        x = self._to_window_order(x, window_index)
        cos, sin = vis.rotary_pos_emb(x, vision_position_ids)
        cos, sin = self._to_window_order(cos, window_index), self._to_window_order(sin, window_index)
        full_mask = _block_mask(full_segments)  # [N, N]
        slot = torch.arange(window_gather.shape[1], device=window_gather.device)
        key_mask = torch.where(slot[None, :] < window_lengths[:, None], torch.zeros((), dtype=torch.float32),
                               torch.full((), torch.finfo(torch.float32).min, dtype=torch.float32))
        key_mask = key_mask[:, None, None, :]  # [W, 1, 1, S]: padding slots are never attended to
        for i, blk in enumerate(vis.blocks):
            h = blk.norm1(x)
            if i in self.full_blocks:
                x = x + self._full_attention(blk.attn, h, cos, sin, full_mask)
            else:
                x = x + self._window_attention(blk.attn, h, cos, sin, window_gather, key_mask, window_scatter)
            x = x + blk.mlp(blk.norm2(x))
        return vis.merger(x).index_select(0, window_inverse)
