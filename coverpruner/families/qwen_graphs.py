"""torch graph wrappers for Qwen2.5-VL (export time only: this module imports torch at import).

QwenVisionGraph runs HF's own vision submodules (patch embedding, axial rotary embedding, blocks' norms,
qkv/proj linears and MLPs, patch merger) with the data-dependent parts supplied as tensors
(coverpruner.families.qwen_vision): window attention and full attention become one dense attention each
with a block-diagonal mask built from segment ids, so the ONNX graph has no Loop over windows and any grid
within the limits runs through the same graph. Scores and softmax are float32 (as HF's eager path).
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
    window_index int64 [n], window_inverse int64 [n], window_segments int64 [N], full_segments int64 [N]
    (see qwen_vision). Output: image_features [n, d_text] (model dtype) == HF
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

    def _attention(self, attn, x, cos, sin, mask):
        n_patches = x.shape[0]
        q, k, v = attn.qkv(x).reshape(n_patches, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        q, k = self.apply_rope(q, k, cos, sin)  # [N, H, hd], rotary in float32 as HF
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, N, hd]
        scores = torch.matmul(q.float(), k.float().transpose(1, 2)) * attn.scaling + mask
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        out = torch.matmul(probs, v).transpose(0, 1).reshape(n_patches, -1)
        return attn.proj(out)

    def forward(self, pixel_values, vision_position_ids, window_index, window_inverse, window_segments,
                full_segments):
        vis = self.visual
        x = vis.patch_embed(pixel_values)
        x = self._to_window_order(x, window_index)
        cos, sin = vis.rotary_pos_emb(x, vision_position_ids)
        cos, sin = self._to_window_order(cos, window_index), self._to_window_order(sin, window_index)
        masks = {False: _block_mask(window_segments), True: _block_mask(full_segments)}
        for i, blk in enumerate(vis.blocks):
            x = x + self._attention(blk.attn, blk.norm1(x), cos, sin, masks[i in self.full_blocks])
            x = x + blk.mlp(blk.norm2(x))
        return vis.merger(x).index_select(0, window_inverse)
