"""The search-space language: a YAML file -> a validated `SearchSpace` -> budget-matched candidates
and the plan that shows them before anything trains. Other packages import from here (the row
selector as `select`); the modules behind it, lowest first:

    yamlsafe    YAML as plain data, with the line and column of every key and value
    source      where a space came from, so every error is located; `--set` overrides
    expr        `when:` conditions, without eval
    domains     an axis's domain: a choice, an integer or float range, a fixed value
    keys        the keys a space may name, read off the configs
    align       hardware-friendly multiples (`align:`)
    budget      the solver that lands a candidate on its parameter budget
    shape       derived-shape axes (`shape.*`)
    tuning      the `tune:` section: a grid per candidate, an equal tuning budget
    language    the file -> SearchSpace
    candidates  points of a space -> candidates, for a grid or for Optuna's define-by-run
    plan        the candidates resolved without training: counts, FLOPs, time estimates
    select      rows picked by the values of their columns (a claim's groups)
"""

from benchmark.space.budget import SOLVE_NONE, BudgetError, solve_budget
from benchmark.space.candidates import choose, define_by_run, resolve
from benchmark.space.domains import Choice, FloatRange, IntRange
from benchmark.space.language import TOP_KEYS, SearchSpace, load_space, parse_budgets
from benchmark.space.plan import SEARCH_START_S, TRIAL_REST_S, first_points, make_plan
from benchmark.space.shape import SHAPE_KEYS
from benchmark.space.source import Override, Source, SpaceError, parse_set
from benchmark.space.tuning import seeds_message
from benchmark.space.yamlsafe import YamlError, load_yaml

__all__ = [
    "SEARCH_START_S",
    "SHAPE_KEYS",
    "SOLVE_NONE",
    "TOP_KEYS",
    "TRIAL_REST_S",
    "BudgetError",
    "Choice",
    "FloatRange",
    "IntRange",
    "Override",
    "SearchSpace",
    "Source",
    "SpaceError",
    "YamlError",
    "choose",
    "define_by_run",
    "first_points",
    "load_space",
    "load_yaml",
    "make_plan",
    "parse_budgets",
    "parse_set",
    "resolve",
    "seeds_message",
    "solve_budget",
]
