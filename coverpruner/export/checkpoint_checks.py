"""What the exported decoder and the runtime assume of a checkpoint's config, checked before anything is exported.

A checkpoint of unusual widths used to export "successfully" into a dir that failed at its first request (issue 40):
ONNX Runtime's GroupQueryAttention CPU kernel (the ORT-form decoder's attention) refuses a head_dim that is not a
multiple of 16 ("head_size shall be a multiple of 16"), and an M-RoPE section that does not cover head_dim / 2
rotary slots made the first text request a 500. Here, from the family's manifest dims (contract: hidden_size,
num_heads, num_kv_heads, head_dim; the M-RoPE families add mrope_section) and the text config's rope parameters:

- head_dim even and positive, num_heads a multiple of num_kv_heads, an mrope_section of three positive sizes
  summing to head_dim / 2: otherwise CheckpointError (one line; nothing written), whatever the decoder form;
- the decoder form: "auto" picks the ORT form only where its graph can run (fp32, head_dim % 16 == 0, full
  default rotary: its rotary rows are computed on the host as theta ** (-2i / head_dim); a partial rotary only
  where the family declares the dims it turns, manifest dims ``rotary_dim``), the standard form
  otherwise; an explicit --decoder-form ort that cannot run is a CheckpointError naming the constraint.
"""

from __future__ import annotations

from coverpruner.export.onnx_io import ExportError

#: ONNX Runtime's GroupQueryAttention CPU kernel needs head_size % 16 == 0 (measured: onnxruntime 1.32 refuses 24)
ORT_FORM_HEAD_MULTIPLE = 16


class CheckpointError(ExportError):
    """The checkpoint's config is inconsistent, or cannot run in the decoder form asked for; nothing was written."""


def _rope(text_config) -> dict:
    rope = dict(getattr(text_config, "rope_parameters", None) or getattr(text_config, "rope_scaling", None) or {})
    if getattr(text_config, "partial_rotary_factor", None) is not None:
        rope.setdefault("partial_rotary_factor", text_config.partial_rotary_factor)
    return rope


def check_dims(dims: dict, text_config) -> None:
    """CheckpointError (one line) when the dims cannot describe a working decoder."""
    head_dim, heads, kv = (int(dims[k]) for k in ("head_dim", "num_heads", "num_kv_heads"))
    if head_dim <= 0 or head_dim % 2:
        raise CheckpointError(f"head_dim {head_dim} must be a positive even number (rotary pairs its dims)")
    if kv <= 0 or heads % kv:
        raise CheckpointError(f"num_attention_heads {heads} must be a multiple of num_key_value_heads {kv}")
    section = dims.get("mrope_section")
    if section is not None:
        # a partial rotary (a family that declares rotary_dim in its dims) turns its first rotary_dim dims only
        what = "rotary_dim" if dims.get("rotary_dim") else "head_dim"
        turned = int(dims.get("rotary_dim") or head_dim)
        if len(section) != 3 or any(int(s) <= 0 for s in section) or sum(section) != turned // 2:
            raise CheckpointError(f"rope mrope_section {list(section)} must be three positive sizes summing to "
                                  f"{what} / 2 = {turned // 2} ({what} {turned}); got sum {sum(section)}")
    factor = _rope(text_config).get("partial_rotary_factor", 1.0)
    if factor is not None and not 0 < float(factor) <= 1:
        raise CheckpointError(f"partial_rotary_factor {factor} must be in (0, 1]")


def _declared_partial(dims: dict, rope: dict, head_dim: int) -> bool:
    """The family's ORT-form graph turns a partial rotary itself: it declares the dims it turns (manifest dims
    ``rotary_dim``, its rotary tables rotary_dim / 2 wide: DecoderWeights.rotary["dim"]) and they are the config's."""
    return int(dims.get("rotary_dim") or 0) == int(head_dim * float(rope["partial_rotary_factor"]))


def resolve_decoder_form(form: str, dtype: str, dims: dict, text_config) -> tuple[str, str | None]:
    """(the decoder form to export, "ort" / "standard"; why "auto" did not pick the ORT form, or None) for
    --decoder-form ``form`` ("auto", "ort", "standard"); CheckpointError when "ort" was asked for and cannot run
    (module doc)."""
    if form == "standard":
        return form, None
    head_dim = int(dims["head_dim"])
    rope = _rope(text_config)
    why = None
    if dtype == "fp32" and head_dim % ORT_FORM_HEAD_MULTIPLE:
        why = (f"ONNX Runtime's GroupQueryAttention CPU kernel needs head_dim % {ORT_FORM_HEAD_MULTIPLE} == 0; this "
               f"checkpoint's head_dim is {head_dim}")
    elif rope.get("rope_type", "default") != "default":
        why = f"rope_type {rope['rope_type']!r} has no ORT-form rotary rows (only the default theta ** (-2i/d))"
    elif float(rope.get("partial_rotary_factor") or 1.0) != 1.0 and not _declared_partial(dims, rope, head_dim):
        why = f"partial_rotary_factor {rope['partial_rotary_factor']}: the ORT form rotates all head_dim dims"
    if why is None:
        return ("ort" if form == "ort" or dtype == "fp32" else "standard"), None
    if form == "ort":
        raise CheckpointError(f"--decoder-form ort: {why}; export with --decoder-form standard (the default picks "
                              "it for this checkpoint)")
    return "standard", f"decoder exported in the standard form: {why}"
