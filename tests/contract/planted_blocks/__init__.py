"""A family planted by tests/contract/test_planted_blocks.py (copied into a temporary package on sys.path): LLaVA-1.5
whose image rows form two bidirectional prefill blocks and whose decoder layers see a sliding window, to prove that
contract v5's attention declarations need no code outside the family package.

Nothing in coverpruner imports this package; the test registers FAMILY in the registry for its own duration.
"""

from coverpruner.families.contract import FamilyEntry

FAMILY = FamilyEntry("planted_blocks.family:BlockLlava", ("llava",))
