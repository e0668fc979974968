"""``python -m workloadplane.enginesim``: serve one simulated vLLM replica."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import uvicorn

from gpufleet_logging import configure_logging
from workloadplane.enginesim.app import Simulator
from workloadplane.enginesim.engine import EngineConfig


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="engine-sim",
        description="Serve a simulated vLLM replica (OpenAI API, vllm:* metrics).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="sim-model", help="served model name")
    parser.add_argument(
        "--tokens-per-s", type=float, default=50.0, help="decode steps per second per sequence"
    )
    parser.add_argument("--startup-delay", type=float, default=0.0, help="cold start, seconds")
    parser.add_argument(
        "--refuse-during-startup",
        action="store_true",
        help="do not listen until the start-up delay has passed, as vLLM does "
        "(default: listen at once and answer 503)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--kv-blocks", type=int, default=4096, help="KV-cache blocks")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--embedding-dim", type=int, default=64)
    parser.add_argument(
        "--error-rate",
        type=float,
        default=0.0,
        help="share of generation requests answered with a 500 engine error (a deliberately "
        "bad revision for rollout tests; real vLLM has no such flag)",
    )
    return parser.parse_args(argv)


def config_from(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        tokens_per_s=args.tokens_per_s,
        max_num_seqs=args.max_num_seqs,
        kv_blocks=args.kv_blocks,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        startup_delay_s=0.0 if args.refuse_during_startup else args.startup_delay,
        embedding_dim=args.embedding_dim,
        error_rate=args.error_rate,
    )


def main(argv: Sequence[str] | None = None) -> None:
    configure_logging("engine-sim", default_level="WARNING")
    args = parse_args(argv)
    try:
        config = config_from(args)
    except ValueError as exc:
        raise SystemExit(f"engine-sim: {exc}") from exc
    if args.refuse_during_startup and args.startup_delay > 0:
        time.sleep(args.startup_delay)  # nothing listens yet: connections are refused
    sim = Simulator(config)
    # log_config=None: uvicorn's lines go through ours (configure_logging), at our level
    uvicorn.run(sim.app, host=args.host, port=args.port, log_config=None, access_log=False)


if __name__ == "__main__":
    main()
