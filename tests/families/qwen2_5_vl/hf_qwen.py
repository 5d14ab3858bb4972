"""HF-side helpers for the Qwen2.5-VL tests (torch, transformers): the reference processor and model.

`hf_processor(ckpt)` is HF's own Qwen2_5_VLProcessor around the checkpoint's tokenizer and PIL image
processor; its video processor is left out (it needs torchvision, which this project does not install),
by skipping the class check for that one absent argument.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path


def hf_processor(ckpt: Path):
    from transformers import AutoTokenizer, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class _ImageOnlyProcessor(Qwen2_5_VLProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(str(ckpt))
    return _ImageOnlyProcessor(image_processor=image_processor, tokenizer=tok, video_processor=None,
                               chat_template=(Path(ckpt) / "chat_template.jinja").read_text())


@lru_cache(maxsize=4)
def hf_model(ckpt: str, attn: str = "eager"):
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32, attn_implementation=attn)
    return model.eval()


def hf_inputs(ckpt: Path, image, prompt: str, **images_kwargs):
    """HF processor output (pt tensors) for one user turn [image, prompt] with the generation prompt."""
    proc = hf_processor(ckpt)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return proc(images=[image], text=[text], return_tensors="pt", **images_kwargs)
