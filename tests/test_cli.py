"""The ``lenserve`` command as a user meets it: failures are one line and a non-zero exit,
and ``generate`` says when the context limit, not ``--max-tokens``, ended its output."""
from __future__ import annotations

import pytest
import torch

from lenserve.cli import build_parser, main
from services.executor.fake import FakeExecutor
from tests.factories import write_checkpoint

FAKE = ["generate", "--model", "fake", "--prompt", "hi", "--temperature", "0", "--ignore-eos"]


@pytest.fixture
def failing_executor(monkeypatch):
    def execute(self, batch):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(FakeExecutor, "execute", execute)


def test_failed_iteration_exits_nonzero_with_one_line(failing_executor, capsys):
    assert main(FAKE) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "lenserve generate: error: executor failed: kernel exploded "
        "(--debug shows the traceback)"]


@pytest.mark.parametrize("flag_first", [False, True])
def test_debug_shows_the_traceback(failing_executor, capsys, flag_first):
    argv = ["--debug", *FAKE] if flag_first else [*FAKE, "--debug"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "kernel exploded" in err


def test_debug_flag_parses_after_nested_subcommands():
    args = build_parser().parse_args(["predictor", "serve", "--debug"])
    assert args.debug
    assert not build_parser().parse_args(["predictor", "serve"]).debug


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda_is_one_line(capsys):
    assert main(["generate", "--model", "opt-tiny", "--prompt", "hi", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "device 'cuda' is not available" in err[0]


def test_output_cut_by_the_kv_pool_says_why(capsys):
    assert main([*FAKE, "--num-gpu-blocks", "1", "--block-size", "16", "--max-tokens", "40"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.strip()) > 0
    note = captured.err.strip()
    assert note.startswith("lenserve generate: note: output stopped at ")
    assert "of --max-tokens 40" in note and "context limit of 16 tokens" in note
    assert "1 block(s) of 16 tokens" in note and "--num-gpu-blocks" in note


def test_output_cut_by_max_model_len_names_that_option(capsys):
    assert main([*FAKE, "--max-model-len", "8", "--max-tokens", "40"]) == 0
    note = capsys.readouterr().err
    assert "context limit of 8 tokens" in note and "--max-model-len is 8" in note


def test_no_note_when_max_tokens_ends_the_output(capsys):
    assert main([*FAKE, "--num-gpu-blocks", "4", "--block-size", "16", "--max-tokens", "5"]) == 0
    assert capsys.readouterr().err == ""


def test_checkpoint_without_tokenizer_runs_on_token_ids(tmp_path, capsys):
    path = write_checkpoint(tmp_path, "llama", tokenizer=False)
    model = ["generate", "--model", str(path), "--temperature", "0", "--max-tokens", "3",
             "--num-gpu-blocks", "4"]
    assert main([*model, "--prompt-token-ids", "5", "6", "7"]) == 0
    ids = capsys.readouterr().out.split()
    assert len(ids) == 3 and all(i.isdigit() for i in ids)
    assert main([*model, "--prompt", "hello"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "no tokenizer files" in err[0] and "prompt_token_ids" in err[0]


@pytest.fixture
def fresh_preset_notes(monkeypatch):
    """Forget which presets this process has pointed out already."""
    from services.executor.models import loader
    monkeypatch.setattr(loader, "_NOTED_PRESETS", set())


def test_a_preset_says_once_on_stderr_that_its_weights_are_random(fresh_preset_notes, capsys):
    from services.executor.models.naming import preset_notice

    argv = ["generate", "--model", "opt-tiny", "--prompt", "Hello, my name is",
            "--max-tokens", "4", "--temperature", "0", "--ignore-eos"]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert first.out.strip() and "random weights" not in first.out      # stdout stays the text
    assert first.err.splitlines() == [f"lenserve: {preset_notice('opt-tiny')}"]
    assert "--model /path/to/hf-model" in first.err
    assert main(argv) == 0
    assert capsys.readouterr().err == ""                                 # once per process


def test_generate_serves_a_hugging_face_checkpoint_directory(tmp_path, fresh_preset_notes,
                                                             capsys):
    """config.json + safetensors + tokenizer, as ``save_pretrained`` writes them: the text
    is the checkpoint's own greedy continuation, and no preset notice is printed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = write_checkpoint(tmp_path, "opt")
    prompt, new = "Hello, my name is", 6
    assert main(["generate", "--model", str(path), "--prompt", prompt, "--max-tokens", str(new),
                 "--temperature", "0", "--ignore-eos", "--dtype", "float32"]) == 0
    captured = capsys.readouterr()
    assert "random weights" not in captured.err
    tokenizer = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt_ids = tokenizer(prompt).input_ids
    if prompt_ids[-1] == hf.config.eos_token_id:   # the engine drops WordPiece's closing [SEP]
        prompt_ids = prompt_ids[:-1]
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    expected = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert captured.out.strip() == expected.strip() and expected.strip()


def test_the_command_map_names_every_command_and_a_command_line_loads_only_its_own():
    import argparse

    from lenserve.cli import COMMANDS, command_of

    def commands(parser):
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return set(sub.choices)

    assert commands(build_parser()) == set(COMMANDS)
    for name, module in COMMANDS.items():
        own = {c for c, m in COMMANDS.items() if m == module}
        assert commands(build_parser(name)) == own
    assert command_of(["--debug", "simulate", "--seed", "1"]) == "simulate"
    assert command_of(["--help"]) is None
    assert commands(build_parser("no-such-command")) == set(COMMANDS)  # argparse says why


def test_bench_transport_separates_the_transport_from_the_forward(capsys):
    assert main(["bench-transport", "--model", "fake", "--num-requests", "3",
                 "--output-len", "4", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    beyond = {line.split()[0]: float(line.split()[1]) for line in out.splitlines()
              if "beyond the executor's own iteration time" in line}
    # In-process the call is the iteration; over gRPC it adds the round trip.
    assert set(beyond) == {"in-process", "grpc"} and beyond["grpc"] > beyond["in-process"]
    assert "tokens identical across transports: True" in out
