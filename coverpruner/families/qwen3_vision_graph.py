"""torch graph wrapper for the Qwen3-VL vision tower, which Qwen3.5 shares without its DeepStack mergers (export time
only: imports torch at import).

Qwen3VisionGraph runs HF's own submodules (patch embedding, learned position table, axial rotary, blocks' norms,
qkv / proj linears and MLPs, the main merger and the DeepStack mergers) with the data-dependent parts supplied as
tensors (vision.py): the position table is interpolated by a gather of 4 cells and a weighted sum; attention runs
over all patches with a block-diagonal mask from the frame ids, in FULL_ATTENTION_CHUNKS query blocks so at most
[H, N/8, N] scores are alive at once (1024x1024: N = 4,096 patches). Scores and softmax in float32, as HF's eager.
"""

from __future__ import annotations

import torch
from torch import nn

#: Query blocks per attention (a fixed count keeps the graph free of a Loop; standard ops only).
FULL_ATTENTION_CHUNKS = 8


class Qwen3VisionGraph(nn.Module):
    """Qwen3-VL / Qwen3.5 vision tower + mergers (Qwen3.5's tower has no DeepStack mergers: levels 0).

    Inputs: pixel_values [N, C*T*P*P] (model dtype), vision_position_ids int64 [N, 2], interp_indices int64 [N, 4],
    interp_weights float32 [N, 4], full_segments int64 [N]. Outputs: image_features [n, d_text] and one
    visual_extra.k [n, d_text] per DeepStack level k < levels (model dtype) == HF `get_image_features`'
    pooler_output and deepstack_features.
    """

    def __init__(self, visual, levels: int):
        super().__init__()
        from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

        self.visual = visual
        self.apply_rope = apply_rotary_pos_emb_vision
        # Qwen3.5's tower (Qwen3_5VisionModel) has no DeepStack indexes at all
        self.deepstack = {int(b): k for k, b in enumerate(getattr(visual, "deepstack_visual_indexes", ()))
                          if k < levels}

    def _attention(self, attn, x, cos, sin, segments):
        n = x.shape[0]
        q, k, v = attn.qkv(x).reshape(n, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)  # [N, H, hd]
        q, k = self.apply_rope(q, k, cos, sin)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, N, hd]
        ends = [i * n // FULL_ATTENTION_CHUNKS for i in range(FULL_ATTENTION_CHUNKS + 1)]
        outs = []
        for a, b in zip(ends[:-1], ends[1:]):
            same = segments[a:b, None] == segments[None, :]
            mask = torch.where(same, torch.zeros((), dtype=torch.float32),
                               torch.full((), torch.finfo(torch.float32).min, dtype=torch.float32))
            scores = torch.matmul(q[:, a:b], k.transpose(1, 2)).float() * attn.scaling + mask
            probs = torch.softmax(scores, dim=-1).to(v.dtype)
            outs.append(torch.matmul(probs, v).transpose(0, 1).flatten(1))  # [B, H*hd]
        return attn.proj(torch.cat(outs, dim=0))

    def forward(self, pixel_values, vision_position_ids, interp_indices, interp_weights, full_segments):
        vis = self.visual
        x = vis.patch_embed(pixel_values)
        pos = (vis.pos_embed(interp_indices) * interp_weights[:, :, None]).sum(1)
        x = x + pos.to(x.dtype)
        cos, sin = vis.rotary_pos_emb(x, vision_position_ids)
        levels = [None] * len(self.deepstack)
        for i, blk in enumerate(vis.blocks):
            x = x + self._attention(blk.attn, blk.norm1(x), cos, sin, full_segments)
            x = x + blk.mlp(blk.norm2(x))
            if i in self.deepstack:
                k = self.deepstack[i]
                levels[k] = vis.deepstack_merger_list[k](x)
        return (vis.merger(x), *levels)
