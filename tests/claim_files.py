"""Claims files the tests write (imported as `claim_files`: pytest puts tests/ on the path)."""

from __future__ import annotations


def abbie_loops_claim(claim: str, study: str, better: int, worse: int) -> str:
    """A claim that AbbIE-D at r = `better` test-time iterations has a lower val_loss than itself at
    r = `worse` (AbbIE §4.3, Fig. 6a): one family, its two groups told apart by their per-loop metric."""
    return f"""\
claims:
  - claim: {claim}
    source: {{paper: AbbIE, where: "§4.3, Fig. 6a"}}
    study: {study}
    metric: val_loss
    order: [r{better}, r{worse}]
    groups:
      r{better}: {{family: abbie-d, metric: val_loss_r{better}}}
      r{worse}: {{family: abbie-d, metric: val_loss_r{worse}}}
"""
