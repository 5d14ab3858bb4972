"""Prototype (issue 18, phase A): the decoder in ONNX Runtime's fused form.

`decoder_graph.build_ort_decoder` writes a decoder graph with ORT contrib ops (GroupQueryAttention with
rotary inside, SkipSimplifiedLayerNormalization, packed QKV; MatMulNBits for precision "int4");
`rotary.rotary_rows` computes the per-token cos/sin rows it takes (1-D or M-RoPE 3-D positions);
`session.OrtFormDecoder` drives it with one preallocated KV buffer per layer, updated in place.
Not wired into export/engines yet: phase B moves these behind the manifest's graph "form".
"""
