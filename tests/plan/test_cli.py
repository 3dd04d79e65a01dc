"""The CLI's JSON contract and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsim.cli.main import main

KEYS = {"step_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "memory_gib_per_gpu", "fits", "breakdown"}


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_estimate_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(
        ["estimate", "--arch", "gpt", "--layers", "96", "--hidden", "12288", "--heads", "96", "--seq", "2048",
         "--vocab", "51200", "--global-batch", "1536", "--gpu", "a100-80gb", "--gpus", "1024", "--tp", "8",
         "--pp", "8", "--schedule", "interleaved", "--recompute", "full", "--json"],
        capsys,
    )
    assert rc == 0
    d = json.loads(out)
    assert set(d) >= KEYS
    assert d["fits"] is True and d["strategy"]["dp"] == 16
    assert 0 < d["mfu"] < 1 and d["model_tflops_per_gpu"] < d["hardware_tflops_per_gpu"]
    assert set(d["breakdown"]) >= {"compute", "tp_comm", "pp_p2p", "pipeline_bubble", "dp_sync_exposed", "optimizer"}


def test_estimate_llama_gqa_and_cluster_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "c.yaml"
    f.write_text("groups:\n  - {gpu: h100, count: 16, gpus_per_node: 8}\n")
    rc, out, _ = _run(["estimate", "--model", "llama2-70b", "--global-batch", "64", "--cluster", str(f), "--tp", "8",
                       "--pp", "2", "--recompute", "selective", "--sequence-parallel", "--zero", "1", "--json"], capsys)
    assert rc == 0
    assert set(json.loads(out)) >= KEYS


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["--gpus", "1000", "--tp", "8", "--pp", "8"], "does not divide --gpus 1000"),
        (["--gpus", "1024", "--tp", "7", "--pp", "1"], "does not divide"),
        (["--gpus", "1024", "--tp", "64", "--pp", "1"], "tp=64 does not divide heads=96"),
        (["--gpus", "1024", "--tp", "16", "--pp", "1"], "exceeds gpus per node"),
        (["--gpus", "1024", "--gpu", "tpu-v4", "--tp", "8"], "unknown GPU 'tpu-v4'"),
        (["--gpus", "0"], "Invalid value for '--gpus'"),
        (["--gpus", "8", "--tp", "0"], "Invalid value for '--tp'"),  # a ZeroDivisionError traceback before
        (["--gpus", "8", "--micro-batch", "0"], "Invalid value for '--micro-batch'"),  # taken as "the fastest"
        (["--gpus", "8", "--gpu-group", "h100:8"], "--gpu-group and --gpu/--gpus both describe the cluster"),
    ],
)
def test_estimate_bad_input_exit_2(args: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["estimate", "--model", "gpt3-175b", "--global-batch", "1536", "--gpu", "a100-80gb"]
    rc, _, err = _run(base + args, capsys)
    assert rc == 2
    assert msg in err and len(err.strip().splitlines()) == 1


def test_plan_json_and_fit_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["plan", "--model", "gpt3-1.3b", "--gpu", "a100-80gb", "--gpus", "16", "--global-batch", "64",
                       "--top", "3", "--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    assert len(d["plans"]) == 3 and set(d["plans"][0]) >= KEYS
    assert d["plans"][0]["simulated_step_s"] is not None
    rc, _, err = _run(["plan", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "8", "--global-batch", "64"],
                      capsys)
    assert rc == 2 and "cannot fit" in err


def test_plan_heterogeneous_groups(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["plan", "--model", "gpt3-1.3b", "--gpu-group", "h100:8", "--gpu-group", "a100-80gb:8",
                       "--global-batch", "32", "--method", "dp", "--top", "2", "--no-simulate", "--json"], capsys)
    assert rc == 0
    assert json.loads(out)["method"] == "dp"


def test_module_docstring_examples_run() -> None:
    import doctest

    from trainsim.plan import comm, devices, estimate, explain, memory, optime, workload

    for mod in (devices, workload, optime, memory, estimate, comm, explain):
        res = doctest.testmod(mod)
        assert res.failed == 0, mod.__name__


@pytest.mark.parametrize("field", ["layers", "hidden", "heads", "seq", "vocab"])
def test_estimate_zero_model_size_is_refused(field: str, capsys: pytest.CaptureFixture[str]) -> None:
    dims = {"layers": "2", "hidden": "64", "heads": "4", "seq": "16", "vocab": "100"}
    dims[field] = "0"
    args = ["estimate", "--arch", "gpt", "--global-batch", "4", "--gpu", "h100", "--gpus", "1"]
    for k, v in dims.items():
        args += [f"--{k}", v]
    rc, _, err = _run(args, capsys)
    assert rc == 2
    assert f"Invalid value for '--{field}'" in err


@pytest.mark.parametrize(
    ("group", "message"),
    [("{gpu: zz, count: 8}", "groups[0].gpu: unknown GPU 'zz'"),
     ("{gpu: h100, count: 16, gpu_per_node: 4}", "groups[0]: unknown key(s) ['gpu_per_node']")],
)  # fmt: skip
def test_cluster_file_errors_name_the_group(tmp_path: Path, group: str, message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """A misspelt key was ignored (gpus_per_node fell back to 8), an unknown GPU did not name the file."""
    f = tmp_path / "c.yaml"
    f.write_text(f"groups:\n  - {group}\n")
    rc, _, err = _run(["estimate", "--model", "llama2-7b", "--global-batch", "8", "--cluster", str(f)], capsys)
    assert rc == 2 and err.startswith(f"trainsim: error: {f}: {message}") and len(err.strip().splitlines()) == 1


def test_a_preset_with_dimensions_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    """--layers with --model used to be ignored without a word: on a transformer preset it now overrides the
    preset's value (half the layers, about half the step), on a CNN it is refused."""
    base = ["estimate", "--model", "gpt3-175b", "--global-batch", "1536", "--gpu", "a100-80gb", "--gpus", "1024",
            "--tp", "8", "--pp", "8", "--json"]  # fmt: skip
    rc, out, _ = _run(base, capsys)
    full = json.loads(out)
    rc2, out, _ = _run([*base, "--layers", "48"], capsys)
    half = json.loads(out)
    assert rc == rc2 == 0 and half["model"] == "gpt3-175b-custom"
    assert 0.4 < half["step_s"] / full["step_s"] < 0.6
    rc, _, err = _run(["estimate", "--model", "resnet50", "--global-batch", "8", "--gpu", "h100", "--gpus", "8",
                       "--layers", "3"], capsys)  # fmt: skip
    assert rc == 2 and "resnet50 is not a transformer; --layers do not apply" in err


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["--model", "mixtral-8x7b", "--gpus", "32", "--ep", "16"], "--ep 16 does not divide experts=8"),
        (["--model", "mixtral-8x7b", "--gpus", "32", "--ep", "64"], "--ep 64 does not divide dp=32"),
        (["--model", "gpt3-175b", "--gpus", "24", "--cp", "3"], "--cp 3 does not divide the sequence length 2048"),
        (["--model", "gpt3-175b", "--gpus", "64", "--pp", "8", "--zero", "3"], "--zero 3 with --pp 8"),
        (["--model", "gpt3-175b", "--gpus", "64", "--tp", "5"], "tp*pp*cp = 5*1*1 = 5 does not divide --gpus 64"),
        (["--model", "gpt3-175b", "--gpus", "64", "--zero", "1", "--shard-group", "8"], "--shard-group applies to ZeRO-3"),
        (["--model", "gpt3-175b", "--gpus", "64", "--nic-gbps", "-1"], "--nic-gbps -1.0; expected a bandwidth > 0"),
        (["--model", "llama2-7b", "--gpus", "8", "--ep", "2"], "--ep 2 needs a mixture-of-experts model"),
        (["--model", "deepseek-v3-like", "--gpus", "64", "--expert-groups", "6"], "--expert-groups 6; expected a divisor of experts (256)"),
        (["--model", "deepseek-v3-like", "--gpus", "64", "--group-top-k", "9"], "--group-top-k 9; expected 1..8 groups"),
        (["--model", "mixtral-8x7b", "--gpus", "32", "--group-top-k", "2"], "--group-top-k needs --expert-groups"),
        (["--model", "mixtral-8x7b", "--gpus", "32", "--ep-overlap"], "--ep-overlap needs expert parallelism (--ep > 1)"),
    ],
)
def test_new_flags_bad_input_exit_2(args: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(["estimate", "--global-batch", "192", "--gpu", "h100", *args], capsys)
    assert rc == 2
    assert msg in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_estimate_explain_lists_terms_with_inputs(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["estimate", "--model", "gpt3-1.3b", "--gpu", "a100-80gb", "--gpus", "16", "--global-batch", "32",
                       "--zero", "3", "--micro-batch", "1", "--explain"], capsys)  # fmt: skip
    assert rc == 0
    assert "fsdp_comm" in out and "tensor cores" in out and "formula inputs" in out
    rc, out, _ = _run(["estimate", "--model", "gpt3-1.3b", "--gpu", "a100-80gb", "--gpus", "16", "--global-batch", "32",
                       "--zero", "3", "--micro-batch", "1", "--json"], capsys)  # fmt: skip
    d = json.loads(out)
    assert {t["name"] for t in d["terms"]} >= {"compute", "fsdp_comm", "optimizer"}
    assert d["breakdown"]["fsdp_comm"] > 0 and d["attn_flops_convention"] == "full"


def test_plan_explains_winner_against_runner_up(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["plan", "--model", "gpt3-1.3b", "--gpu", "a100-80gb", "--gpus", "16", "--global-batch", "64",
                       "--top", "2", "--no-simulate", "--explain", "--json"], capsys)  # fmt: skip
    assert rc == 0
    d = json.loads(out)
    assert d["why"].startswith("#1 is ") and d["term_differences"]
    rc, out, _ = _run(["plan", "--model", "gpt3-1.3b", "--gpu", "a100-80gb", "--gpus", "16", "--global-batch", "64",
                       "--top", "2", "--no-simulate", "--explain"], capsys)  # fmt: skip
    assert rc == 0 and "plan 1 against plan 2" in out and "#1 is " in out


def test_plan_searches_expert_parallel_degree(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["plan", "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "32", "--global-batch", "64",
                       "--top", "3", "--no-simulate", "--json"], capsys)  # fmt: skip
    assert rc == 0
    eps = {p["strategy"]["ep"] for p in json.loads(out)["plans"]}
    assert eps and all(8 % e == 0 for e in eps)
