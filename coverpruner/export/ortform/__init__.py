"""The decoder in ONNX Runtime's fused form (graphs.decoder.form "ort", docs/engine-dir.md).

`decoder_graph.build_ort_decoder` writes it from the family's decoder weights with ORT contrib ops
(GroupQueryAttention with rotary inside, SkipSimplifiedLayerNormalization, packed QKV; MatMulNBits for precision
"int4"). The runtime side (host rotary rows, in-place KV, batching) is engines/rotary.py and
engines/ort_form_decoder.py.
"""
