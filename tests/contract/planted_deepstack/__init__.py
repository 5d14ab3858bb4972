"""A family planted by tests/contract/test_planted_family.py (copied into a temporary package on sys.path): LLaVA-1.5
plus two DeepStack-like decoder extras, to prove that contract v4 needs no code outside the family package.

Nothing in coverpruner imports this package; the test registers FAMILY in the registry for its own duration.
"""

from coverpruner.families.contract import FamilyEntry

FAMILY = FamilyEntry("planted_deepstack.family:DeepStackLlava", ("llava",))
