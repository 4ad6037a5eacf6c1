"""``python -m cocodet.tracking replay RUN_DIR [--tracking-uri URI]``: send what a run could not
send to MLflow (``tracking/replay.py``). One line of JSON on stdout; a user error in one line on
stderr, exit 2."""

from __future__ import annotations

import argparse
import json
import sys

from cocodet.errors import UserError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cocodet.tracking", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    replay = commands.add_parser("replay", help="send a run's mlflow_unsent.jsonl to its MLflow run (idempotent)")
    replay.add_argument("run_dir", help="the run's folder (hydra.run.dir), which holds mlflow_unsent.jsonl")
    replay.add_argument(
        "--tracking-uri",
        default=None,
        help="the server; default MLFLOW_TRACKING_URI, else the one the run's summary.json names",
    )
    args = parser.parse_args(argv)
    from cocodet.tracking.replay import replay as run_replay

    try:
        sent = run_replay(args.run_dir, args.tracking_uri)
    except UserError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    print(json.dumps(sent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
