"""What a build selected (``PlanChoice``), and the heuristics every build asks for."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence, Tuple

import cudnn
import torch

HEURISTICS = (cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK)
Spec = Tuple[Sequence[int], Sequence[int], torch.dtype, bool]  # (shape, stride, dtype, host scalar) of one operand


@dataclasses.dataclass
class PlanChoice:
    """What a build selected and why. ``plan`` is None on the untuned path, which is
    exactly ``graph.build()`` and does not look the heuristics' choice up."""

    plan: Optional[str]
    index: Optional[int]
    source: str  # "heuristic" | "tuned" | "cache"
    reason: str = ""
    candidates: int = 0  # plans timed
    fastest_ms: Optional[float] = None  # the chosen plan's median time
    heuristic_plan: Optional[str] = None
    heuristic_ms: Optional[float] = None
    timings_ms: Dict[str, float] = dataclasses.field(default_factory=dict)  # plan name -> median ms
    skipped: Dict[str, str] = dataclasses.field(default_factory=dict)  # plan -> why it was not a candidate
