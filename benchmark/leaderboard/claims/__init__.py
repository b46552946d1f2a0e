"""Claims: orderings the papers report, checked against a study's rows.

A claims file (`search_spaces/claims/*.yaml`) lists claims. Each names its source (paper and where
in it), the study, the metric, its groups (column filters over the study's ok rows) and the order
it expects them in, best first (under the metric's direction):

    claims:
      - claim: Hyperloop beats Looped at matched parameters
        source: {paper: Hyperloop Transformers (Zeitoun et al. 2026), where: "§4.2, Table 1"}
        study: quickstart
        metric: val_loss
        order: [hyperloop, looped]
        groups: {hyperloop: {family: hyperloop}, looped: {family: looped}}
        where: {budget: 1.5M}           # optional: a filter every group shares

`study` may be left out: the claim is then checked in every study read, one result each.

A filter names a results column (`family`, `budget`, `streams`, ...) or, as `axes.KEY`, the value
the trial's search point gave an axis (`axes.hyper.mixing: diagonal`, `axes.variant: K4-L12`), so
candidates that differ in any axis can be told apart.

A group may name its own `metric`, which overrides the claim's for that group, so a claim can
compare one model with itself at two loop counts (AbbIE §4.3: AbbIE-D at r = 4 against r = 2) or
AbbIE-D at r = 2 against a Transformer's val_loss:

        metric: val_loss
        order: [r4, r2]
        groups: {r4: {family: abbie-d, metric: val_loss_r4}, r2: {family: abbie-d, metric: val_loss_r2}}

A group's metric shares the claim's kind, unit and direction (a loss with a loss), so that their
difference means something; the rows of both groups may be the same ones, and still pair by seed.

A claim may give the paper's own difference, `published:` (better - worse in the claim's metric,
one number per adjacent pair of the order: a number, or a list for three groups or more). The
report says whether it lies in the interval (size: consistent, larger, smaller) and whether these
seeds could decide it at all ("underpowered": the test's power at it below 50%). (A published
difference is the paper's scale; the effect at another scale may be larger or smaller.)

A group may hold several candidates (the quickstart's two depths): its rows are averaged per seed,
so each seed counts once and the groups pair by seed (a seed that lost one of them to a failure is
averaged over those it has). Each adjacent pair of the order gets the difference (first - second)
with a 95% t interval, paired when both groups hold the same seeds, Welch's otherwise
(stats.compare), its p-value adjusted over every pair of the file (Holm by default), its verdict at
that adjusted p (reproduced, contradicted, not decided), and the smallest difference these seeds
detect with 80% power. One seed a side gives no interval: "not decided (1 seed)", never a verdict.
What the groups' models differ in, and whether that is only what the claim tests: arms.py.
Reading the file: file.py; checking its claims against the rows: check.py; two studies' reports
compared claim by claim: compare.py.
"""

from benchmark.leaderboard.claims.check import NO_DATA, ONE_SEED, Group, Pair, Result, evaluate
from benchmark.leaderboard.claims.file import Claim, ClaimsError, ClaimsFile, load
from benchmark.leaderboard.claims.render import table, to_json, verdicts

__all__ = [
    "NO_DATA",
    "ONE_SEED",
    "Claim",
    "ClaimsError",
    "ClaimsFile",
    "Group",
    "Pair",
    "Result",
    "evaluate",
    "load",
    "table",
    "to_json",
    "verdicts",
]
