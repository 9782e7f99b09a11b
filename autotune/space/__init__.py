"""The search space: candidate layouts and the named rules that remove the illegal ones.

Data flow: `search_space.candidates` (every combination a `SearchSpace` allows) →
`rules.apply_rules` (each framework's named rules, memory last) → `enumerate_layouts`
(the survivors, ranked by the cost model, with what each rule removed).
"""

from autotune.space.rules import apply_rules
from autotune.space.rules import rules_for
from autotune.space.search_space import Enumeration
from autotune.space.search_space import SearchSpace
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space

__all__ = ["Enumeration", "SearchSpace", "apply_rules", "enumerate_layouts", "load_space",
           "rules_for"]
