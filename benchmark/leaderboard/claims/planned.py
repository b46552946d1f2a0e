"""Each claim's arms as planned, before any training: `python -m benchmark.leaderboard.claims.planned
CLAIMS SPACE...` plans every space (as `shapebench plan SPACE` does), matches each claim's groups
in the plan of its study, and prints, per claim, a table of its arms (d_model, heads, head_dim, the
FFN's width and ratio, the structure, the hyper-connections, the embeddings, the parameters under the
space's count) with what differs between them and whether the comparison is controlled. The same
lines follow a plan's candidates with `shapebench plan SPACE --claims CLAIMS` (for_plan)."""

from __future__ import annotations

import argparse
import sys

from benchmark.leaderboard.claims import arms as arms_
from benchmark.leaderboard.claims.file import ClaimsError, ClaimsFile, load
from benchmark.space import SpaceError, load_space, make_plan, parse_set, select

COLUMNS = (
    ("group", "arm"),
    ("family", "family"),
    ("d_model", "d_model"),
    ("n_heads", "heads"),
    ("head_dim", "head_dim"),
    ("ffn", "FFN width (× d_model)"),
    ("structure", "layers"),
    ("hyper", "hyper-connections"),
    ("tie_embeddings", "tied emb."),
    ("params", "params"),
    ("tokens", "tokens"),
)


def claim_arms(claims: ClaimsFile, plans: dict) -> list[tuple]:
    """(claim, study, count, Arms, the metric the space tunes by) for each claim whose study is one
    of `plans` (name -> Plan)."""
    out = []
    for c in claims.claims:
        plan = plans.get(c.study)
        if plan is None:
            continue
        rows = arms_.plan_rows(plan)
        shared = rows[select.mask(rows, c.where)]
        groups = {
            g: arms_.candidates_of(shared[select.mask(shared, c.groups[g])], plan.space.count)
            for g in c.order
        }
        filters = {g: {**c.where, **c.groups[g]} for g in c.order}
        out.append(
            (
                c,
                c.study,
                plan.space.count,
                arms_.compare(groups, filters, arms_.declaration(plan.space), c.tokens),
                plan.space.tune.metric if plan.space.tune is not None else "",
            )
        )
    return out


def _tuned_by(claim, metric: str) -> str:
    """'; tuned by val_loss' where the space tunes its arms on another metric than the claim's."""
    if not claim.tuned_by_other(metric):
        return ""
    judged = sorted({claim.metric_of(g).column for g in claim.order})
    return f"; tuned by {metric}, judged by {', '.join(judged)}"


def markdown(found: list[tuple]) -> str:
    parts = []
    for claim, study, count, arms, tuned_by in found:
        head = (
            "| "
            + " | ".join(h if k != "params" else f"params ({count})" for k, h in COLUMNS)
            + " |"
        )
        lines = [
            f"### {claim.claim}",
            f"`{study}` — **{arms.label}**; differ in: "
            + (", ".join(arms.differ) or "nothing")
            + f"; token rule: {claim.tokens}"
            + _tuned_by(claim, tuned_by),
            "",
            head,
            "|" + "---|" * len(COLUMNS),
        ]
        for g in claim.order:
            for f in arms.groups[g] or [{}]:
                cells = {
                    **f,
                    "group": g,
                    "ffn": f"{f.get('ffn.kind', '?')} {f.get('ffn.K', 1)}×{f.get('ffn.width', '?')} "
                    f"({f.get('ffn.width_ratio', '?')})",
                    "params": f"{f.get('params', 0):,}",
                    "tokens": f"{f['tokens']:,}" if f.get("tokens") else "—",
                }
                lines.append("| " + " | ".join(str(cells.get(k, "—")) for k, _ in COLUMNS) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def for_plan(path: str, plan, out) -> int:
    """`shapebench plan SPACE --claims FILE`: after the candidates, each claim of FILE on the
    plan's study, as markdown() writes it, to `out`. 2 (and one line on stderr) for a claims file
    that does not load; a file without a claim on this study says so on stderr."""
    try:
        claims = load(path)
    except ClaimsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    found = claim_arms(claims, {plan.space.name: plan})
    if not found:
        studies = ", ".join(dict.fromkeys(c.study for c in claims.claims))
        print(
            f"note: no claim of {path} is on study {plan.space.name} (its studies: {studies})",
            file=sys.stderr,
        )
        return 0
    out.write(
        f"\nClaims of {path} on {plan.space.name}, their arms as planned:\n\n" + markdown(found)
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmark.leaderboard.claims.planned", description=__doc__
    )
    p.add_argument("claims", help="a claims file (search_spaces/claims/*.yaml)")
    p.add_argument("spaces", nargs="+", help="the search spaces of its studies")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a space key (every space)",
    )
    args = p.parse_args(argv)
    try:
        claims = load(args.claims)
        overrides = [parse_set(s) for s in args.set]
        plans = {}
        for path in args.spaces:
            space = load_space(path, overrides)
            plans[space.name] = make_plan(space)
    except (ClaimsError, SpaceError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(markdown(claim_arms(claims, plans)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
