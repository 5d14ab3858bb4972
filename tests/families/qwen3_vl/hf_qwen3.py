"""HF-side helpers for the Qwen3-VL tests (torch, transformers): HF's own Qwen3VLProcessor around the checkpoint's
tokenizer and PIL image processor (its video processor, which needs torchvision, left out by skipping the class
check for that one absent argument) and the eager float32 model."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path


def hf_processor(ckpt: Path):
    from transformers import AutoTokenizer, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class _ImageOnlyProcessor(Qwen3VLProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return _ImageOnlyProcessor(image_processor=Qwen2VLImageProcessorPil.from_pretrained(str(ckpt)),
                               tokenizer=AutoTokenizer.from_pretrained(str(ckpt)), video_processor=None,
                               chat_template=(Path(ckpt) / "chat_template.jinja").read_text())


@lru_cache(maxsize=2)
def hf_model(ckpt: str):
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    model = Qwen3VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def hf_inputs(ckpt: Path, image, prompt: str):
    """HF processor output (pt tensors) for one user turn [image, prompt] with the generation prompt."""
    proc = hf_processor(ckpt)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return proc(images=[image], text=[text], return_tensors="pt")
