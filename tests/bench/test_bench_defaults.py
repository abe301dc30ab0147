"""What ``lenserve bench`` runs when flags are left out: the bundled workload, a KV pool and a
context limit that always fit each other, and the predictor of length-aware policies."""
from __future__ import annotations

import argparse

import pytest

from lenserve.bench.backends import BackendOptions, parse_backend_spec
from lenserve.bench.defaults import (
    BENCH_NUM_GPU_BLOCKS,
    BENCH_SWAP_SPACE_GIB,
    BENCH_WORKLOAD,
    BLOCK_SIZE,
    DEFAULT_LENGTH_PREDICTOR,
    MODEL_CONTEXT,
    REQUESTS_PER_POOL,
    backend_predictor,
    kv_sizes,
    reads_predictions,
)
from lenserve.commands import bench


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lenserve")
    bench.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_no_flags_give_the_bundled_workload_and_a_pool_that_holds_the_limit():
    args = parse()
    assert (args.dataset_name, args.dataset_path) == ("sharegpt", None)
    assert (args.num_prompts, args.request_rate) == (BENCH_WORKLOAD.num_prompts,
                                                     BENCH_WORKLOAD.request_rate)
    assert args.predictor is None and args.num_gpu_blocks is None and args.max_model_len is None
    assert args.swap_space == BENCH_SWAP_SPACE_GIB > 0
    bench.apply_kv_sizes(args)
    assert args.num_gpu_blocks == BENCH_NUM_GPU_BLOCKS
    assert args.max_model_len == min(MODEL_CONTEXT,
                                     BENCH_NUM_GPU_BLOCKS * BLOCK_SIZE // REQUESTS_PER_POOL)


def test_the_default_workload_builds_from_the_bundled_sample():
    """Enough of the bundled conversations fit the default limits, with real lengths."""
    args = parse()
    bench.apply_kv_sizes(args)
    (workload,) = bench.build_workloads(args, bench.load_samples(args.dataset_name, None),
                                        bench.sample_config(args), [args.request_rate],
                                        bench.load_tokenizer(args))
    requests = workload.requests
    assert len(requests) == args.num_prompts
    assert all(r.prompt and r.prompt_len + r.output_len <= args.max_model_len for r in requests)
    assert len({r.output_len for r in requests}) > len(requests) // 2   # not one forced length
    # Waiting for KV: the pool holds a few of them at most.
    pool = args.num_gpu_blocks * BLOCK_SIZE
    assert sum(r.prompt_len + r.output_len for r in requests) > 4 * pool


def test_simulate_keeps_its_own_workload_defaults():
    from lenserve.commands import simulate
    parser = argparse.ArgumentParser(prog="lenserve")
    simulate.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["simulate"])
    assert (args.dataset_name, args.max_model_len, args.predictor) == ("lengths", MODEL_CONTEXT,
                                                                       "none")


def test_a_pool_alone_sets_the_limit_and_says_so():
    blocks = BENCH_NUM_GPU_BLOCKS // 2
    sizes = kv_sizes(None, blocks)
    limit = blocks * BLOCK_SIZE // REQUESTS_PER_POOL
    assert (sizes.max_model_len, sizes.num_gpu_blocks) == (limit, blocks)
    assert f"--max-model-len {limit}" in sizes.note
    assert f"--num-gpu-blocks {blocks}" in sizes.note
    assert f"up to {blocks * BLOCK_SIZE}" in sizes.note


def test_a_one_block_pool_still_gets_a_limit():
    assert kv_sizes(None, 1).max_model_len == BLOCK_SIZE // REQUESTS_PER_POOL


def test_a_large_pool_keeps_the_models_context_without_a_note():
    sizes = kv_sizes(None, 2 * REQUESTS_PER_POOL * MODEL_CONTEXT // BLOCK_SIZE)
    assert sizes.max_model_len == MODEL_CONTEXT and sizes.note is None


def test_a_limit_alone_grows_the_default_pool_to_hold_it():
    long = BENCH_NUM_GPU_BLOCKS * BLOCK_SIZE + 1
    grown = kv_sizes(long, None).num_gpu_blocks
    assert grown * BLOCK_SIZE >= REQUESTS_PER_POOL * long > (grown - 1) * BLOCK_SIZE
    assert kv_sizes(BLOCK_SIZE, None).num_gpu_blocks == BENCH_NUM_GPU_BLOCKS


def test_a_limit_the_pool_cannot_hold_names_what_to_pass():
    with pytest.raises(ValueError) as info:
        kv_sizes(2048, 64)
    message = str(info.value)
    assert f"pass --max-model-len {64 * BLOCK_SIZE}" in message
    assert f"--num-gpu-blocks {2048 // BLOCK_SIZE}" in message


@pytest.mark.parametrize("mml,blocks,flag", [(0, None, "--max-model-len"),
                                             (None, 0, "--num-gpu-blocks"),
                                             (None, -3, "--num-gpu-blocks")])
def test_sizes_below_one_are_refused(mml, blocks, flag):
    with pytest.raises(ValueError, match=f"{flag} must be >= 1"):
        kv_sizes(mml, blocks)


def test_the_readme_comparison_with_a_small_pool_runs(capsys):
    """``--num-gpu-blocks 64`` alone once failed: max_model_len 2048 exceeded the pool."""
    args = parse("--backends", "lenserve:vllm,lenserve:alise", "--predictor", "oracle",
                 "--num-gpu-blocks", "64", "--num-prompts", "4", "--model", "fake",
                 "--output-len", "6", "--request-rate", "50", "--disable-tqdm")
    assert bench.run_bench(args) == 0
    captured = capsys.readouterr()
    assert "lenserve:alise" in captured.out
    assert f"--max-model-len {64 * BLOCK_SIZE // REQUESTS_PER_POOL}" in captured.err


def test_an_explicit_limit_above_the_pool_fails_before_any_model_loads():
    args = parse("--num-gpu-blocks", "8", "--max-model-len", "2048", "--model", "no-such-model")
    with pytest.raises(ValueError, match="exceeds the KV pool"):
        bench.run_bench(args)


@pytest.mark.parametrize("policy,expected", [("alise", True), ("ssjf", True),
                                             ("econoserve", True), ("vllm", False),
                                             ("orca", False), ("no-such-policy", False)])
def test_length_aware_policies_are_the_ones_that_read_predictions(policy, expected):
    assert reads_predictions(policy) is expected


@pytest.mark.parametrize("backend,given,expected", [
    ("lenserve:alise", None, DEFAULT_LENGTH_PREDICTOR),
    ("lenserve:vllm", None, "none"),
    ("lenserve:oracle", None, "none"),          # reads the true lengths instead
    ("hf-static", None, "none"),
    ("lenserve:vllm", "embedded", "embedded"),  # a given predictor goes to every backend
    ("lenserve:alise", "none", "none"),
])
def test_the_predictor_of_each_backend(backend, given, expected):
    assert backend_predictor(parse_backend_spec(backend), given) == expected


def test_a_chosen_predictor_is_said_once_per_backend(capsys):
    options = BackendOptions()
    alise = bench.with_predictor(parse_backend_spec("lenserve:alise"), options, None)
    vllm = bench.with_predictor(parse_backend_spec("lenserve:vllm"), options, None)
    assert (alise.predictor, vllm.predictor) == (DEFAULT_LENGTH_PREDICTOR, "none")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "lenserve:alise" in err[0]
    assert f"--predictor {DEFAULT_LENGTH_PREDICTOR}" in err[0]
