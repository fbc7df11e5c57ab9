"""Hostile input: one regression test per defect an adversarial pass found (each reproduced first).

Every one must end in a perfmodel.core.errors exception (exit 2 and one line on the CLI) or a finite
result, in seconds and bounded memory.
"""

import copy
import json

import numpy as np
import pandas as pd
import pytest

import perfmodel as pm
from perfmodel.cli import main
from perfmodel.core.checks import LIMITS, divisors
from perfmodel.core.readers import MAX_DEPTH
from perfmodel.profiles.profile import Profile


def cli(capsys, *args):
    """(exit status, stdout, stderr) of the command line run in this process."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *args, match=""):
    code, out, err = cli(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and err.startswith("perfmodel"), (code, err)
    assert match in err, err
    return out


# 1. NaN/inf with exit 0 -----------------------------------------------------------------------------
def test_1_huge_micro_batch_is_refused_naming_the_bound(capsys):
    with pytest.raises(pm.InvalidInputError, match=r"'micro_batch' must be an integer between 1 and 1,048,576: got 1000"):
        pm.Strategy(micro_batch=10**300)
    with pytest.raises(pm.InvalidInputError, match="'global_batch' must be an integer between"):
        pm.Strategy(global_batch=10**30)
    refused(capsys, "predict", "--micro-batch", 10**300, match="'micro_batch' must be an integer between")
    p = pm.predict("gpt2-small", "h200", pm.Strategy(micro_batch=LIMITS["micro_batch"]))  # the bound itself
    assert np.isfinite([p.step_time, p.peak_memory, p.tokens_per_second]).all()


# 2. profiles that load but predict NaN/inf --------------------------------------------------------
@pytest.fixture(scope="module")
def h200_profile():
    return pm.load_profile("h200-sxm-141gb").to_dict()


@pytest.mark.parametrize("section, name, value, what", [
    ("compute", "R", 5e-324, "FLOP/s or bytes/s"), ("compute", "t0", 1e308, "seconds"),
    ("intra", "busbw_bytes_per_s", 1e-300, "FLOP/s or bytes/s"), ("intra", "alpha_s", 1e308, "seconds"),
    ("compute", "T", 5.7e-267, "a count of SMs or tile rows"), ("compute", "sms", 0.5, "a count of SMs or tile rows"),
    ("compute", "elem_bytes", 1e-30, "bytes per element")])
def test_2_profile_parameters_bounded_by_physics(h200_profile, section, name, value, what):
    data = copy.deepcopy(h200_profile)
    entries = data["compute"].values() if section == "compute" else [data["collectives"]["intra"]["all_reduce"]]
    for entry in entries:
        if name in entry["params"]:
            entry["params"][name] = value
    with pytest.raises(pm.ProfileError, match=rf"parameter '{name}' = .* outside what is physically possible for {what}"):
        Profile.from_dict(data)


# 3. fit memory grows faster than the table --------------------------------------------------------
def test_3_fit_bounds_the_rows_it_takes_and_says_so():
    from perfmodel.fit.tables import bound_rows

    base = pd.DataFrame({"op": ["gemm"] * 4, "m": [64, 128, 256, 512], "n": 64, "k": 64, "time_s": 1e-5})
    many = pd.concat([base] * 3000, ignore_index=True)  # 12,000 rows, 4 distinct cases
    kept, done = bound_rows(many, limit=1000)
    assert len(kept) == 4 and sum(done.values()) == len(many) - 4 and "repeats merged" in next(iter(done))
    distinct = pd.DataFrame({"op": "gemm", "m": np.arange(1, 5001), "n": 64, "k": 64, "time_s": 1e-5})
    kept, done = bound_rows(distinct, limit=1000)
    assert len(kept) == 1000 and done == {"sampled out (over 1,000 distinct cases)": 4000}
    assert bound_rows(base, limit=1000) == (base, {})  # a calibration-sized table is untouched


# 4. tracebacks on the CLI --------------------------------------------------------------------------
def test_4_hf_config_counts_checked_where_read(tmp_path, capsys):
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": [0],
           "head_dim": 3e8, "intermediate_size": 128, "vocab_size": 100}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    refused(capsys, "predict", "--model", tmp_path / "c.json", match="'num_attention_heads' must be an integer")
    cfg["num_attention_heads"] = "4"
    with pytest.raises(pm.InvalidInputError, match="'num_attention_heads' must be an integer >= 1: got '4'"):
        pm.from_hf_config(cfg)


@pytest.mark.parametrize("kind", ["binary", "deep-json", "deep-toml", "nul"])
def test_4_every_file_reader_refuses_binary_and_deep_files(tmp_path, capsys, kind):
    text = {"binary": bytes(range(256)), "deep-json": b"[" * 100_000 + b"]" * 100_000,
            "deep-toml": b"a = " + b"[" * 100_000 + b"]" * 100_000, "nul": b"a = 1\x00\n"}[kind]
    for suffix in (".json", ".toml"):
        path = tmp_path / f"f{suffix}"
        path.write_bytes(text)
        for args in (("predict", "--model", path), ("predict", "--gpu", path), ("predict", "--profile", path),
                     ("compare", "--strategies", path)):
            refused(capsys, *args)


def test_4_nesting_limit_is_stated():
    from perfmodel.core.readers import parse_json, parse_toml

    parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x")
    with pytest.raises(pm.InvalidInputError, match=f"deeper than {MAX_DEPTH} levels"):
        parse_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "x")
    with pytest.raises(pm.InvalidInputError, match=f"deeper than {MAX_DEPTH} levels"):
        parse_toml("a = " + "[" * 2000 + "]" * 2000, "x")


def test_4_gpu_toml_without_fp32_gets_a_datasheet_profile(tmp_path):
    (tmp_path / "g.toml").write_text('name = "bf16-only"\nmemory = "80GiB"\nmemory_bandwidth = "3TB/s"\n'
                                     'sm_count = 100\n[peak_flops]\nbf16 = "900TFLOPS"\n')
    p = pm.predict("gpt2-small", pm.cluster(str(tmp_path / "g.toml")), pm.Strategy())
    assert np.isfinite(p.step_time) and p.step_time > 0


def test_4_workers_and_nodes_take_ascii_digits_only(capsys):
    refused(capsys, "plan", "--workers", "k80:\u00b2", "--steps", 10, match="'--workers' must be GPU:COUNT")
    refused(capsys, "predict", "--nodes", "\u0663", match="must be an integer >= 1")


def _nccl_log(rows: str) -> str:
    return ("# Collective test starting: all_reduce_perf\n#  size  count  type  redop  root  time  algbw  busbw "
            "#wrong  time  algbw  busbw  #wrong\n" + rows)


GOOD_ROWS = "".join(f"  {s}  {s // 4}  float  sum  -1  10.00  0.00  0.00  0  10.00  0.00  0.00  0\n"
                    for s in (8, 16, 32, 64))


def test_4_11_import_nccl_tests_refuses_absurd_rows(tmp_path, capsys):
    bad = (f"  {2**70}  2  float  sum  -1  10.00  0.0  0.0  0  10.0  0.0  0.0  0\n"
           f"  {'9' * 100_000}  2  float  sum  -1  10.00  0.0  0.0  0  10.0  0.0  0.0  0\n"
           "  128  32  float  sum  -1  1e-300  0.0  0.0  0  10.0  0.0  0.0  0\n")
    (tmp_path / "all_reduce_perf.log").write_text(_nccl_log(GOOD_ROWS + bad))
    code, out, _ = cli(capsys, "import-nccl-tests", tmp_path / "all_reduce_perf.log", "--out", tmp_path / "o")
    assert code == 0 and "imported 4 rows" in out and "skipped 3 unreadable lines" in out
    table = pd.read_csv(tmp_path / "o" / "collectives.csv")
    assert np.isfinite(table[["algbw_GBps", "busbw_GBps"]].to_numpy(float)).all()


@pytest.mark.parametrize("name, content", [("collectives.csv", bytes(range(256))), ("collectives.csv", b"x,y\n1,2\n"),
                                           ("metadata.json", b"{nope"), ("metadata.json", b"[1]")])
def test_4_import_nccl_tests_checks_existing_files_before_writing(tmp_path, capsys, name, content):
    (tmp_path / "all_reduce_perf.log").write_text(_nccl_log(GOOD_ROWS))
    out = tmp_path / "o"
    out.mkdir()
    (out / name).write_bytes(content)
    refused(capsys, "import-nccl-tests", tmp_path / "all_reduce_perf.log", "--out", out)
    assert (out / name).read_bytes() == content and sorted(p.name for p in out.iterdir()) == [name]


@pytest.mark.parametrize("bytes_value", ["-5", "nan", None])
def test_4_fit_rows_without_a_usable_size_are_rejected(tmp_path, capsys, bytes_value):
    from perfmodel.fit.tables import clean_rows

    rows = pd.DataFrame({"op": "copy", "phase": "fwd", "timing": "eager", "dtype": "fp32",
                         "bytes": [2.0**20 * (i + 1) for i in range(6)], "time_s": 1e-4})
    if bytes_value is None:
        rows = rows.drop(columns="bytes")
    else:
        rows.loc[0, "bytes"] = float(bytes_value)
    kept, reasons = clean_rows(rows)
    assert len(kept) == (0 if bytes_value is None else 5)
    assert reasons == {"missing or non-positive bytes (copy)": 6 if bytes_value is None else 1}


# 5. API exceptions outside perfmodel.core.errors -------------------------------------------------------
@pytest.mark.parametrize("kwargs", [dict(zero=3.0), dict(sequence_parallel=True), dict(precision=(None,)),
                                    dict(recompute=3), dict(zero=(3,)), dict(zero="3")])
def test_5_search_options_refused_cleanly(kwargs):
    with pytest.raises(pm.PerfModelError):
        pm.search("gpt2-small", "h200", 8, **kwargs)


def test_5_search_of_a_graph_refuses_unfused_attention_as_predict_does():
    with pytest.raises(pm.UnsupportedError, match="traced graph"):
        pm.search("resnet50", "h200", 8, attention="unfused")


def test_5_compare_defaults_are_strategy_fields():
    with pytest.raises(pm.UnknownNameError, match="unknown strategy field 'foo'"):
        pm.compare("gpt2-small", "h200", ["dp=1"], defaults={"foo": 1})
    with pytest.raises(pm.InvalidInputError, match="'defaults' must be a mapping"):
        pm.compare("gpt2-small", "h200", ["dp=1"], defaults=[1])


# 6. hangs and memory ------------------------------------------------------------------------------
def test_6_sizes_refused_up_front_with_the_limit_named():
    with pytest.raises(pm.InvalidInputError, match="'pp' must be an integer between 1 and 256"):
        pm.Strategy(pp=100_000, stage_layers=(1,) * 100_000)
    with pytest.raises(pm.InvalidInputError, match="'nodes' must be an integer between"):
        pm.cluster("h200", nodes=10**9)
    with pytest.raises(pm.InvalidInputError, match="'max_virtual_stages' must be an integer between 1 and 64"):
        pm.search("gpt2-small", "h200", 8, max_virtual_stages=100_000)
    with pytest.raises(pm.InvalidInputError, match="search space of .* configurations"):
        pm.search("gpt2-small", pm.cluster("hgx-h200", nodes=64), 2**20, max_micro_batch=1024, max_virtual_stages=64)
    with pytest.raises(pm.InvalidInputError, match="'servers' must be an integer between 0 and"):
        pm.predict_mixed("gpt2-small", [("k80", 2)], servers=10**9)
    with pytest.raises(pm.InvalidInputError, match=r"workers\[.k80.\] count. must be an integer between"):
        pm.predict_mixed("gpt2-small", [("k80", 10**9)])


def test_6_gpu_count_hint_is_quick_for_huge_counts():
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36] and len(divisors(2**24)) == 25
    with pytest.raises(pm.InvalidInputError, match="must equal the cluster's GPU count 1000000"):
        pm.predict("gpt2-small", pm.cluster("h200", nodes=10**6), pm.Strategy(dp=1))
    with pytest.raises(pm.InvalidInputError, match="seq=1073741824 must be divisible by 2 × cp = 6"):
        pm.predict(pm.transformer(2, 64, 4, seq=2**30), pm.cluster("h200", nodes=3), pm.Strategy(cp=3, micro_batch=1))


def test_6_monte_carlo_bounds_trials_times_revocations():
    from perfmodel.analysis.transient.montecarlo import simulate

    with pytest.raises(pm.InvalidInputError, match="'trials' must be an integer between 1 and 1,000,000"):
        simulate(1000.0, revocation=100.0, workers=1, checkpoint_s=1.0, restart_s=1.0, trials=10**8)
    with pytest.raises(pm.InvalidInputError, match="revocations one simulation draws"):
        simulate(9e6, revocation=100.0, workers=1, checkpoint_s=1.0, restart_s=1.0, interval_s=50.0, trials=10_000)


# 7. tp_overlap / dp_overlap from text --------------------------------------------------------------
def test_7_overlap_flags_read_from_text_and_numbers(tmp_path):
    df = pm.compare("gpt2-small", "h200", ["tp_overlap=true", "tp_overlap=1,dp_overlap=off"])
    assert len(df) == 2
    assert pm.Strategy(tp_overlap="yes", dp_overlap=0) == pm.Strategy(tp_overlap=True, dp_overlap=False)
    # a table cell (a search row read back) holds numpy's bool
    assert pm.Strategy(tp_overlap=np.True_, dp_overlap=np.False_) == pm.Strategy(tp_overlap=True, dp_overlap=False)
    with pytest.raises(pm.InvalidInputError, match="'tp_overlap' must be True or False"):
        pm.Strategy(tp_overlap=2)


# 8. an empty model TOML --------------------------------------------------------------------------
def test_8_empty_model_toml_is_refused(tmp_path, capsys):
    (tmp_path / "empty.toml").write_text("")
    refused(capsys, "predict", "--model", tmp_path / "empty.toml", match="needs preset")
    (tmp_path / "ok.toml").write_text('preset = "gpt2-small"\nseq = 512\n')
    from perfmodel.workload.presets import model_from_toml

    assert model_from_toml(tmp_path / "ok.toml").seq == 512


# 9. MFU above 100% -------------------------------------------------------------------------------
def test_9_mfu_stays_below_one_at_long_sequences():
    m = pm.transformer(layers=2, hidden=1024, heads=16, seq=2**24, vocab=50304)
    p = pm.predict(m, pm.cluster("h100"), pm.Strategy(micro_batch=1))
    assert 0 < p.mfu < 1 and p.tflops_per_gpu * 1e12 < pm.cluster("h100").gpu.peak_flops["bf16"]


# 10. unwritable outputs found after the work --------------------------------------------------------
@pytest.mark.parametrize("args", [("fit", "nowhere", "-o", "/proc/p.json"),
                                  ("compare", "--strategies", "dp=1", "--out", "/proc/x.csv"),
                                  ("compare", "--strategies", "dp=1", "--plot", "/proc/x.png"),
                                  ("calibrate", "--out", "/proc/x")])
def test_10_unwritable_outputs_refused_before_any_work(capsys, args):
    out = refused(capsys, *args, match="cannot")
    assert out == ""


# 13. exit statuses of calibrate under signals ------------------------------------------------------
@pytest.mark.parametrize("child_code, expected", [(-15, 143), (-9, 137), (0, 0), (130, 130)])
def test_13_calibrate_reports_a_signal_as_a_shell_does(monkeypatch, tmp_path, child_code, expected):
    import importlib.util
    import subprocess

    class Child:
        def wait(self):
            return child_code

        def send_signal(self, signum):
            pass

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(subprocess, "Popen", lambda cmd: Child())
    assert main(["calibrate", "--out", str(tmp_path / "c")]) == expected
