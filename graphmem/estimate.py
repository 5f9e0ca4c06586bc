"""Estimate one training step's memory for a workspace: `analysis/step_estimate.py`.

The function lives with the analyses (`graphmem inspect` gathers its facts there, below the
drivers); this name stays for the callers that import it from here.
"""

from __future__ import annotations

from graphmem.analysis.step_estimate import estimate_step

__all__ = ["estimate_step"]
