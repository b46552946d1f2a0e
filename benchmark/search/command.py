"""`shapebench plan` and `shapebench search`: their flags, and what each runs (docs/searches-and-results.md).

    shapebench plan [SPACE.yaml] --budget 113M [--count total] [--trials N] [--tokens 20x|5M]
        [--set KEY=VALUE ...] [--seed S] [--json] [--claims FILE] [--data SOURCE] [--tokenizer bpe]
        [--gpu-tflops 400] [--gpu-memory 80GiB] [--address auto]
        [--reuse-runs FOLDER ... [--cpus-per-trial N] [--concurrency N]]
    shapebench search [SPACE.yaml] --budget 113M [the plan's flags] [--name STUDY] [--results DIR]
        [--resume] [--address auto] [--seeds N] [--time-budget 30m] [--concurrency N] ...
    shapebench search --spec ARCH.yaml [--tokens 2M] [--data SOURCE] [--checkpoint DIR]

`--set KEY=VALUE` sets any key of the space over the file (`--set training.seq_len=128`,
`--set 'axes.family=[transformer, looped]'`), VALUE read as YAML; `--budget`, `--count`, `--trials`
and `--tokens` are short for `--set budget=..`, `count`, `trials`, `training.tokens`, applied after
the `--set`s. A plan resolves and prints the candidates without training (run_plan); a search runs
them (`run_study` -> search.run_search). `--spec` trains and evaluates one architecture
(trial/single.py). Exit codes: 0 done, 2 a problem with the space, the spec or the flags (a space
edited since its study began included), reported as one line (`path:line:col: key: what is wrong`),
3 the search stopped early for the machine's sake (a full disk, Ray that could not start or lost
its head, the study's database away past --storage-wait), 130 the user stopped it (Ctrl-C): finished
rows are kept and the line says how to resume.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from benchmark.arch.counting import COUNTS
from benchmark.console import console as wide_console
from benchmark.data import DataConfig
from benchmark.perf import probe, timing
from benchmark.recipe import PRECISIONS, TrainConfig, parse_duration, parse_size, parse_tokens
from benchmark.search import (
    SAMPLERS,
    STORAGE_WAIT_S,
    SearchHalted,
    SearchOptions,
    StudyError,
    check_declared,
    gpus,
    loggers,
    preflight,
    reuse,
    reuse_plan,
    run_search,
    saving,
    schedule,
    summary,
)
from benchmark.search.gate import LIMIT_HOURS, too_big
from benchmark.space.language import SearchSpace, SpaceError, load_space, parse_budgets
from benchmark.space.memory import check_fits
from benchmark.space.plan import ASSUMED_GPU_FLOPS, make_plan, records, render
from benchmark.space.source import Override, parse_set
from benchmark.store.declaration import read_study_info
from benchmark.store.location import RESULTS_ROOT, check_results, is_dir
from benchmark.store.results import ResultsError, check_study_name

PLAN, SEARCH = "shapebench plan", "shapebench search"  # the commands, as their messages begin
DEFAULT_SPACE = Path(__file__).resolve().parents[2] / "search_spaces" / "default.yaml"
SEARCH_ONLY = (
    "name",
    "results",
    "resume",
    "seeds",
    "time_budget",
    "sampler",
    "storage",
    "rerun",
    "storage_wait",
    "gpus_per_trial",
    "workers_per_trial",
    "parallel",
    "yes",
    "pending_timeout",
    "spec",
    "checkpoint",
    *saving.FLAGS,
    *loggers.FLAGS,
)  # search-only flags; a plan's --cpus-per-trial and --concurrency: with --reuse-runs (reuse_plan)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _space_flags(p: argparse.ArgumentParser) -> None:
    """The flags a plan and its search share: which space, at what budget, trained how."""
    p.add_argument(
        "space", nargs="?", default=None, help=f"search-space YAML (default: {DEFAULT_SPACE.name})"
    )
    p.add_argument(
        "--budget",
        type=saving.checked(parse_budgets),
        help="parameter budget, e.g. 113M, 1.2B, 500K, "
        "or a ladder: 1M,2M,4M (every candidate at every budget)",
    )
    p.add_argument(
        "--count", choices=COUNTS, help="what the budget counts (default: the space's `count`)"
    )
    p.add_argument(
        "--trials", type=_positive, help="candidates to sample (default: the space's `trials`)"
    )
    p.add_argument(
        "--tokens",
        type=saving.checked(parse_tokens),
        help="training tokens: 20x (per parameter) or 5M",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="set a key of the space over the file, "
        "VALUE as YAML (repeatable): --set training.seq_len=128 --set 'axes.family=[transformer, looped]'",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for sampling candidates (default 0)")
    p.add_argument(
        "--data",
        default=DataConfig.source,
        help="corpus: embedded, embedded:wiki,bible, hf:NAME, or files (default: %(default)s)",
    )
    p.add_argument(
        "--tokenizer",
        default=DataConfig.tokenizer,
        help="bpe, bpe:VOCAB, gpt2 or hf:NAME (default: %(default)s; bpe = 8192)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="autocast policy (default: the space's "
        f"training.precision, else {TrainConfig.precision})",
    )
    p.add_argument("--no-compile", action="store_true", help="train eagerly (no torch.compile)")
    p.add_argument(
        "--gpu-tflops",
        type=_amount,
        default=ASSUMED_GPU_FLOPS / 1e12,
        help="the achieved training TFLOP/s per GPU the estimate's GPU-hours assume "
        "(default: %(default)g, an H100 at ~40%% of its dense bf16 peak)",
    )
    p.add_argument(
        "--cache",
        help="the token cache, built once and read by every node: on a cluster, the study's "
        "storage (s3://BUCKET/cache; each node downloads it into its own cache) or a shared "
        "folder (NFS) (default: $SHAPEBENCH_CACHE, else ~/.cache/shapebench)",
    )
    p.add_argument(
        "--gpu-memory",
        type=saving.checked(parse_size),
        help="a GPU's memory (80GiB): each run's micro-batch is the largest that fits, "
        "its accumulation keeps the batch (recipe/memory.py); default with --address: the "
        "smallest of the cluster's GPUs",
    )
    p.add_argument("--address", help="Ray cluster address, e.g. auto")
    p.add_argument(
        "--reuse-runs",
        action="append",
        metavar="FOLDER",
        help="take each run whose model, training, quantisation, data, tokenizer and hardware "
        "equal a measured run's in FOLDER (a study, or a folder of studies) from it instead of "
        "training it (repeatable; the row says which: reused_from); a plan says which of its runs "
        "a search here would take, its threads as --cpus-per-trial and --concurrency give them",
    )


def _search_flags(p: argparse.ArgumentParser, hidden: bool) -> None:
    """The flags only a search uses (SEARCH_ONLY). A plan takes them `hidden`, to refuse them in
    one line of its own rather than argparse's usage message."""

    def add(*names, help: str, **kw) -> None:
        p.add_argument(*names, help=argparse.SUPPRESS if hidden else help, **kw)

    add(
        "--name",
        type=saving.checked(check_study_name),
        help="study name (default: the space's name)",
    )
    add(
        "--results",
        help="where rows go: a folder (local or NFS) or a URI such as s3://bucket/results "
        f"(pyarrow.fs; default: {RESULTS_ROOT}/)",
    )
    add(
        "--storage",
        help="Optuna storage URL shared by several drivers, e.g. postgresql://... "
        "(default: SQLite in the study folder)",
    )
    add(
        "--storage-wait",
        type=saving.checked(parse_duration),
        help="how long the study's database may be away "
        f"(a restart, a failover) before the search stops, resumable (default {STORAGE_WAIT_S:g} s)",
    )
    add("--resume", action="store_true", help="continue an interrupted study")
    add(
        "--rerun",
        action="append",
        metavar="COLUMN=VALUE",
        help="train anew the finished candidates whose rows match",
    )
    add(
        "--seeds",
        type=_positive,
        help="train every chosen candidate with N seeds (default: the space's `seeds`, else 1)",
    )
    add(
        "--time-budget",
        type=saving.checked(parse_duration),
        help="cap the whole search, e.g. 30m, 2h",
    )
    add(
        "--sampler",
        choices=SAMPLERS,
        help="Optuna sampler (default: auto, or the one a resumed study ran "
        "with; docs/search-spaces.md#samplers)",
    )
    add("--concurrency", type=_positive, help="trials at once (default: as many as the nodes hold)")
    add(
        "--cpus-per-trial",
        type=_amount,
        help="CPUs per trial (default: the largest node's CPUs, shared by "
        "the trials it runs at once)",
    )
    add(
        "--gpus-per-trial",
        type=_amount,
        help="GPUs per trial, fractions share a GPU, e.g. 0.25 (default: 1 "
        "when the cluster has GPUs); 2 or more runs each trial data-parallel on that many GPUs of one node "
        "(docs/clusters.md)",
    )
    add(
        "--workers-per-trial",
        type=_positive,
        help="run each trial as a Ray Train job of N workers (default: "
        "--gpus-per-trial when 2 or more; on CPUs, gloo workers sharing --cpus-per-trial)",
    )
    add(
        "--parallel",
        choices=("auto", "ddp", "fsdp"),
        help="how a trial of several workers shares the model: "
        "ddp, fsdp (FSDP2), or auto: fsdp when its training state would not fit one GPU",
    )
    add(
        "--pending-timeout",
        type=saving.checked(parse_duration),
        help="stop, naming what is missing, when no trial can start for this long (default 10m)",
    )
    add(
        "--yes",
        action="store_true",
        help=f"run a search estimated at more than {LIMIT_HOURS} h without asking",
    )
    loggers.add_flags(add)
    saving.add_flags(add, runs_as_tasks=not hidden)  # a plan's own: schedule.add_flag
    add("--spec", help="train and evaluate one architecture (YAML) instead of a search")
    add("--checkpoint", help="with --spec: save the trained model here (safetensors + spec.json)")


def build_plan_parser(prog: str = PLAN) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Resolve and print the candidates a search would train; train nothing.",
    )
    _space_flags(p)
    p.add_argument("--json", action="store_true", help="one JSON object per candidate on stdout")
    p.add_argument(
        "--claims",
        metavar="FILE",
        help="then each claim of FILE on this space's study, its arms and "
        "the keys they differ in (as the board's --claims plans them)",
    )
    schedule.add_flag(p)
    _search_flags(p, hidden=True)
    return p


def build_search_parser(prog: str = SEARCH) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run or resume an architecture search at a fixed "
        "parameter budget, or train one architecture (--spec).",
    )
    _space_flags(p)
    _search_flags(p, hidden=False)
    # A plan's own flags, hidden: --claims is refused in one line; --json changes nothing here.
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--claims", metavar="FILE", help=argparse.SUPPRESS)
    return p


def _amount(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def plan_main(argv: list[str] | None = None, prog: str = PLAN) -> int:
    """`shapebench plan`: exit 0, or 2 with one line for a space, a flag or a search-only flag."""
    args = build_plan_parser(prog).parse_args(argv)
    given = [
        f"--{f.replace('_', '-')}" for f in SEARCH_ONLY if getattr(args, f) not in (None, False)
    ]
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        print(f"{PLAN}: {', '.join(given)} {verb} only to a search, not to a plan", file=sys.stderr)
        return 2
    if unused := schedule.unused(args) or reuse_plan.unused(args):
        print(f"{PLAN}: {unused}", file=sys.stderr)
        return 2
    try:
        _data(args)  # the corpus and tokenizer the search would train on: refused here as there
    except ValueError as e:
        print(f"{PLAN}: {e}", file=sys.stderr)
        return 2
    try:
        return run_plan(_load(args), args)
    except SpaceError as e:
        print(e, file=sys.stderr)
        return 2


def search_main(argv: list[str] | None = None, prog: str = SEARCH) -> int:
    """`shapebench search`: the exit codes of the module docstring."""
    args = build_search_parser(prog).parse_args(argv)
    if args.spec and args.set:
        print(
            f"{SEARCH}: --set sets a key of a search space, not of --spec (edit the spec file)",
            file=sys.stderr,
        )
        return 2
    if args.spec:
        return _run_single(args)
    try:
        return run_study(_load(args), args)
    except SpaceError as e:
        print(e, file=sys.stderr)
        return 2


def _run_single(args: argparse.Namespace) -> int:
    from benchmark.trial.single import (
        run_single,  # torch and the trial: only a --spec run pays for them
    )

    try:
        data = _data(args)
    except ValueError as e:
        print(f"{SEARCH}: {e}", file=sys.stderr)
        return 2
    return run_single(
        args.spec,
        tokens=args.tokens,
        seed=args.seed,
        policy=_policy(args),
        data=data,
        checkpoint=args.checkpoint,
    )


def _load(args: argparse.Namespace) -> SearchSpace:
    return load_space(Path(args.space) if args.space else DEFAULT_SPACE, overrides(args))


# The flags that are short for a `--set`: flag -> the key it sets.
SHORT_FOR = {"budget": "budget", "count": "count", "trials": "trials", "tokens": "training.tokens"}


def overrides(args: argparse.Namespace) -> list[Override]:
    """The `--set`s in the order given, then the flags that are short for one (so they win)."""
    out = [parse_set(text) for text in args.set or ()]
    return out + [
        Override.flag(flag, key, getattr(args, flag))
        for flag, key in SHORT_FOR.items()
        if getattr(args, flag) is not None
    ]


def run_plan(space: SearchSpace, args: argparse.Namespace) -> int:
    plan, cfg = _plan(space, args), _trial_config(space, args)
    gpu_memory, said = gpus.gpu_memory(args.gpu_memory, args.address)
    preflight.say(sys.stderr if args.json else wide_console(), said)
    rows = records(plan, probe.estimates(plan, cfg), cfg=cfg, gpu_memory=gpu_memory)
    check_fits(space, rows)  # a run that cannot fit one sequence: one line
    rows, search = preflight.with_passes(rows, _data(args, space)), timing.search_times()
    if args.reuse_runs:  # what other studies measured of each candidate's runs
        opts, policy = _options(space, args, space.name), _policy(args)
        seen = reuse_plan.foresee(space, plan, opts, policy, cfg, gpu_memory)
        rows = [{**r, "reuse": found} for r, found in zip(rows, seen.found)]
    render(plan, rows, wide_console(), search, as_json=args.json, gpu_flops=args.gpu_tflops * 1e12)
    preflight.plan_passes(space, rows, sys.stderr if args.json else wide_console())
    if args.reuse_runs:
        reuse_plan.show(seen, rows, sys.stderr if args.json else wide_console(), args.json)
    if args.workers:  # with --json on stderr, as the plan's other lines: stdout stays JSON
        tasks, flops = args.runs_as_tasks is not False, args.gpu_tflops * 1e12
        text = schedule.line(space, rows, args.workers, flops, tasks)
        if args.json:
            print(text, file=sys.stderr)
        else:
            wide_console().print(escape(text))
    if (
        args.claims
    ):  # each claim of the file on this space's study: its arms, what differs, what is confounded
        # the leaderboard (pandas, scipy, matplotlib) loads only for --claims
        from benchmark.leaderboard.claims.planned import for_plan

        return for_plan(args.claims, plan, sys.stderr if args.json else sys.stdout)
    return 0


def _policy(args: argparse.Namespace) -> dict:
    """The flags' training settings, over the space's `training:`: only those given (its fp32 holds)."""
    return {
        **({"precision": args.precision} if args.precision else {}),
        **({"compile": False} if args.no_compile else {}),
    }


def _trial_config(
    space: SearchSpace, args: argparse.Namespace
) -> TrainConfig:  # as TrialContext makes it
    return TrainConfig.from_dict({**space.trial_training, **_policy(args)})


def _data(args: argparse.Namespace, space: SearchSpace | None = None):
    """The corpus, tokenizer and the space's `data:`; ValueError for a source that cannot be read."""
    return preflight.data_config(args.data, args.tokenizer, space, args.cache).checked()


def run_study(space: SearchSpace, args: argparse.Namespace) -> int:
    """Run (or continue) the search: Ray Tune + OptunaSearch over `candidates.define_by_run(space)`."""
    console = Console(stderr=True)
    name = args.name or space.name
    try:
        if args.claims:
            raise ValueError(
                "--claims applies only to a plan (shapebench board --claims checks trained rows)"
            )
        opts = _options(space, args, name)
        if args.resume and not is_dir(opts.study_dir):
            print(
                f"{SEARCH}: --resume: no study named {name!r} under {opts.results_dir}/",
                file=sys.stderr,
            )
            return 2
        if args.resume:
            space = as_declared(space, args, opts.study_dir)
            opts = _options(space, args, name)
        space, opts = preflight.as_declared_data(space, opts)  # a study keeps its sampling
        plan = _plan(space, args)  # before training: every candidate builds, its schedule fits
        gpu_memory, said = gpus.gpu_memory(args.gpu_memory, args.address)
        preflight.say(console, said)
        space = preflight.fit_memory(space, plan, _trial_config(space, args), gpu_memory)
        if not (args.yes or args.address or args.resume):  # estimated, asked before hours of it
            cfg, flops = _trial_config(space, args), args.gpu_tflops * 1e12
            stop = too_big(plan, cfg, opts.seeds, name, args.space, args.budget, flops)
            if stop is not None:
                return stop
        # before anything is trained: a path that cannot take rows is one line
        for folder in opts.reuse_runs:  # a folder without rows is a typo: said, nothing made
            reuse.studies_in(folder)
        check_results(opts.study_dir)
        check_declared(space, opts)  # a space edited since the study began: one line
        preflight.search_passes(space, plan, opts.data)  # tokenised once; passes held to the limit
    except (ResultsError, StudyError) as e:
        print(f"{SEARCH}: {name}: {e}", file=sys.stderr)
        return 2
    except SpaceError as e:
        print(e, file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"{SEARCH}: {e}", file=sys.stderr)
        return 2
    console.print(
        f"[bold]{name}[/bold]: {space.description or space.name} -- {space.trials} trials, "
        f"budget {', '.join(map(str, space.budgets))} ({space.count}), tokens {space.training.get('tokens')}"
        + (
            f"; set on the command line: {escape(' '.join(space.overrides))}"
            if space.overrides
            else ""
        )
    )
    try:
        s = run_search(space, opts, console, policy=_policy(args))
    except (
        StudyError,
        ResultsError,
    ) as e:  # a study that cannot go on as asked, a results path that cannot be used
        print(f"{SEARCH}: {name}: {e}", file=sys.stderr)
        return 2
    except SearchHalted as e:  # one line: what failed, where, what to try, and how to go on
        if e.kind == "interrupted" and e.summary is not None:  # stopped by the user: what ran
            summary.show(console, e.summary)
        then = {
            "store_full": "finished rows are kept; once there is space: ",
            "interrupted": "to go on: ",
        }.get(e.kind, "then: ")
        print(
            f"{SEARCH}: {name}: stopped: {e}"
            + (f"; {then}{_resume_command(args, name)}" if e.halt.resumable else ""),
            file=sys.stderr,
        )
        return e.halt.exit_code
    summary.show(console, s)
    if line := summary.budget_spent(s, args.time_budget, _resume_command(args, name)):
        print(f"{SEARCH}: {name}: {line}", file=sys.stderr)
    return 0


def _options(space: SearchSpace, args: argparse.Namespace, name: str):
    return SearchOptions(
        name=name,
        results_dir=args.results or Path(RESULTS_ROOT),
        seed=args.seed,
        seeds=args.seeds or space.seeds,
        concurrency=args.concurrency,
        address=args.address,
        storage=args.storage,
        cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=args.gpus_per_trial,
        workers_per_trial=args.workers_per_trial,
        parallel=args.parallel or "auto",
        rerun=tuple(args.rerun or ()),
        reuse_runs=tuple(args.reuse_runs or ()),
        data=_data(args, space),
        sampler=args.sampler,
        resume_command=_resume_command(args, name),
        **loggers.options(args),
        time_budget_s=parse_duration(args.time_budget) if args.time_budget else None,
        **saving.options(args),
        **{
            f"{flag}_s": parse_duration(text)
            for flag in ("pending_timeout", "storage_wait")
            if (text := getattr(args, flag))
        },
    )


def _resume_command(args: argparse.Namespace, name: str) -> str:
    """The command that continues this study as it ran: its `--set`s come back from the declaration
    (as_declared), but the flags short for one and `--seeds` must be given again (else the resumed
    space differs from the declared one, which is refused), and so must the data and precision
    (else the rest of the study trains on another corpus, or in another precision)."""
    parts = [SEARCH] + ([args.space] if args.space else [])
    parts += [f"--name {name}"] + ([f"--results {args.results}"] if args.results else [])
    parts += [
        f"--{flag} {getattr(args, flag)}"
        for flag in (*SHORT_FOR, "seeds")
        if getattr(args, flag) is not None
    ]
    defaults = {"data": DataConfig.source, "tokenizer": DataConfig.tokenizer, "precision": None}
    parts += [
        f"--{flag} {getattr(args, flag)}"
        for flag, default in defaults.items()
        if getattr(args, flag) != default
    ]
    parts += ["--no-compile"] if args.no_compile else []
    parts += [f"--reuse-runs {shlex.quote(folder)}" for folder in args.reuse_runs or ()]
    parts += ([f"--storage {args.storage}"] if args.storage else []) + ["--resume"]
    return " ".join(parts)


def as_declared(space: SearchSpace, args: argparse.Namespace, study_dir) -> SearchSpace:
    """A study resumes as it was declared: the `--set`s its _study.json recorded are set again
    when none are given; different ones are refused, as a study is one experiment."""
    recorded = [
        t for t in read_study_info(study_dir).get("overrides") or () if t.startswith("--set ")
    ]
    given = [o for o in space.source.overrides if o.given.startswith("--set ")]
    if [o.given for o in given] == recorded:
        return space
    if given:
        raise ValueError(
            f"--resume: this study was run with {' '.join(recorded) or 'no --set'}; resume it with "
            "the same --set, or none to set them again (or start a new study with --name)"
        )
    path = Path(args.space) if args.space else DEFAULT_SPACE
    return load_space(
        path, [parse_set(t.removeprefix("--set ")) for t in recorded] + overrides(args)
    )


def _plan(space: SearchSpace, args: argparse.Namespace):
    """The candidates a plan shows; SpaceError for one that cannot be built or trained as asked."""
    import optuna

    optuna.logging.set_verbosity(
        optuna.logging.WARNING
    )  # no "study created" chatter from a sampled plan
    return make_plan(space, seed=args.seed)
