"""shapebench tasks OUT_DIR [--source embedded] [--n 500] [--seed 0]: write the offline tasks."""

import argparse

from benchmark.data import DataConfig
from benchmark.tasks.heldout import MAX_WORDS, make_tasks


def main(argv: list[str] | None = None, prog: str = "shapebench tasks") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("out_dir", help="where the task YAMLs and their jsonl data go")
    parser.add_argument(
        "--source",
        default=DataConfig.source,
        help="a data source, as data.source; its validation split is used",
    )
    parser.add_argument("--n", type=int, default=500, help="examples per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-words", type=int, default=MAX_WORDS, help="longest passage, in words"
    )
    parser.add_argument(
        "--name", default="shapebench", help="task names are NAME_cloze and NAME_choice"
    )
    args = parser.parse_args(argv)
    tasks = make_tasks(
        args.out_dir,
        args.source,
        n_examples=args.n,
        seed=args.seed,
        max_words=args.max_words,
        name=args.name,
    )
    print(f"wrote {', '.join(tasks)}; run them with --include_path {args.out_dir}")


if __name__ == "__main__":
    main()
