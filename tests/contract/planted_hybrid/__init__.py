"""A family planted by tests/contract/test_planted_state.py (copied into a temporary package on sys.path): LLaVA-1.5
whose language model is a hybrid decoder (transformers' Qwen3.5 text model: Gated DeltaNet layers that carry a conv
and a recurrent state, then a gated full-attention layer), to prove that contract v5 (decoder state that is not KV,
the probe layer choice) needs no code outside the family package.

Nothing in coverpruner imports this package; the test registers FAMILY in the registry for its own duration.
"""

from coverpruner.families.contract import FamilyEntry

FAMILY = FamilyEntry("planted_hybrid.family:HybridLlava", ("llava",))
