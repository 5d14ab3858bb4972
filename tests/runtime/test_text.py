"""Chat template + tokenization == the HF LlavaProcessor; instruction positions from offsets."""

from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from coverpruner.families import get_family
from coverpruner.runtime.errors import PromptError
from coverpruner.runtime.text import PromptEncoder, StreamDecoder

transformers = pytest.importorskip("transformers")
from coverpruner.testing.llava_checkpoints import LLAVA_HF_CHAT_TEMPLATE, build_processor  # noqa: E402
from coverpruner.testing.tokenizer import train_tokenizer  # noqa: E402

PROMPTS = ["What is shown in this image?", "  How many red cars are there?\nAnswer with one word. ",
           "Describe the scene: sky, tree, house – and the STOP sign (ünïcode).", "x"]


@pytest.fixture(scope="module")
def hf_processor(tmp_path_factory):
    proc = build_processor(train_tokenizer(vocab_size=600, seed=3), image_size=56, patch_size=14)
    root = tmp_path_factory.mktemp("proc")
    proc.save_pretrained(root)
    return proc, root


def _encoder(root, proc, n):
    """The runtime's encoder with the llava family's run-time rules bound to a minimal manifest."""
    image_id = proc.tokenizer.convert_tokens_to_ids("<image>")
    manifest = SimpleNamespace(processor={"crop_size": 56, "shortest_edge": 56}, chat_template=LLAVA_HF_CHAT_TEMPLATE,
                               token_ids={"image_token_id": image_id}, max_visual_tokens=n, float_dtype="float32",
                               dims={"image_size": 56, "patch_size": 14})
    return _Encoder(PromptEncoder(root / "tokenizer.json", image_id, get_family("llava").runtime(manifest)), n)


class _Encoder:
    """encode(prompt) -> ConversationLayout with the image span fixed at n rows (LLaVA-1.5: n is the checkpoint's)."""

    def __init__(self, inner, n):
        self.inner, self.n = inner, n
        self.tokenizer, self.decode = inner.tokenizer, inner.decode

    def encode(self, prompt):
        """One user turn [image, prompt] through the live path (PromptEncoder.encode_conversation)."""
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        return self.inner.encode_conversation(messages, [self.n])


@pytest.mark.parametrize("prompt", PROMPTS)
def test_ids_equal_hf_processor(hf_processor, prompt):
    proc, root = hf_processor
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True)
    image = Image.new("RGB", (60, 70), (10, 200, 30))
    want = proc(images=image, text=text, return_tensors="np")["input_ids"][0]
    n = int((want == proc.tokenizer.convert_tokens_to_ids("<image>")).sum())
    assert n == 16  # 56/14 squared, CLS dropped
    enc = _encoder(root, proc, n).encode(prompt)
    assert enc.text == text.replace("<image>", "<image>" * n)
    np.testing.assert_array_equal(enc.input_ids, want)
    assert enc.visual_positions.tolist() == np.flatnonzero(want == proc.tokenizer.convert_tokens_to_ids("<image>")).tolist()


def test_instruction_positions_cover_exactly_the_prompt(hf_processor):
    proc, root = hf_processor
    enc = _encoder(root, proc, 16).encode("How many red cars are there?")
    tok = proc.tokenizer
    pieces = tok.convert_ids_to_tokens(enc.input_ids[enc.instruction_positions].tolist())
    decoded = tok.convert_tokens_to_string(pieces).strip()
    assert decoded == "How many red cars are there?"
    # nothing of the template ("USER:", "ASSISTANT:", BOS, "\n") and no visual token is an instruction token
    assert not set(enc.instruction_positions.tolist()) & set(enc.visual_positions.tolist())
    first, last = enc.instruction_positions[0], enc.instruction_positions[-1]
    assert np.array_equal(enc.instruction_positions, np.arange(first, last + 1))
    assert first > enc.visual_positions[-1]
    rest = tok.convert_tokens_to_string(tok.convert_ids_to_tokens(enc.input_ids[last + 1:].tolist()))
    assert rest.strip() == "ASSISTANT:"


def test_prompt_errors(hf_processor):
    """An empty prompt is refused by Pipeline.request before any layout (tests/runtime/test_stages.py,
    test_native_sequence_rejects_an_empty_prompt); the layout refuses the image token in the text."""
    proc, root = hf_processor
    enc = _encoder(root, proc, 16)
    with pytest.raises(PromptError, match="must not contain the image token"):
        enc.encode("look at <image> please")


def test_stream_decoder_pieces_join_to_full_text(hf_processor):
    proc, root = hf_processor
    enc = _encoder(root, proc, 16)
    ids = enc.tokenizer.encode("Red house near the tall tree, ünïcode ✓ 2025!", add_special_tokens=False).ids
    sd = StreamDecoder(enc.inner)
    pieces = [sd.push(i) for i in ids] + [sd.flush()]
    assert "".join(pieces) == enc.decode(ids) == proc.tokenizer.decode(ids, skip_special_tokens=True)
    assert sum(1 for p in pieces if p) > 3  # really incremental
