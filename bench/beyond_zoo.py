"""Benchmark: models the zoo does not hold, as a user brings them. Each is a model file
(timm by name, a Hugging Face family from a tiny config written here, or one of the
hand-written RNNs of bench/beyond_rnns.py, copied into it) run through the CLI with the
default options, `inspector inspect FILE:model --json OUT`, on its freshly initialised
weights. One row per
model: the report's wall time, its warning/error findings, red gradient verdicts, the
analysis's own warnings, graph breaks and Dynamo's notes, the export's verdict, and the
estimate's errors against the measured step (forward peak, saved, train peak). A healthy
fresh model should have none of the first three; the errors should be within 2%.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/beyond_zoo.py            # all
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/beyond_zoo.py --only hf-gptj
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RNNS = ROOT / "bench" / "beyond_rnns.py"

# timm name -> (image size, batch)
TIMM = {
    "ghostnet_100": (64, 2), "dla34": (64, 2), "hrnet_w18_small": (64, 2),
    "repvgg_a0": (64, 2), "fastvit_t8": (64, 2), "efficientvit_b0": (64, 2),
    "edgenext_xx_small": (64, 2), "tiny_vit_5m_224": (224, 2), "sequencer2d_s": (64, 2),
    "davit_tiny": (64, 2), "focalnet_tiny_srf": (64, 2), "hiera_tiny_224": (224, 2),
    "rexnet_100": (64, 2), "ese_vovnet19b_dw": (64, 2), "cspdarknet53": (64, 2),
    "resnest14d": (64, 2), "nfnet_f0": (64, 2), "inception_next_tiny": (64, 2),
    "regnetz_b16": (64, 2), "pvt_v2_b0": (64, 2), "mvitv2_tiny": (224, 2),
    "mambaout_femto": (64, 2), "starnet_s1": (64, 2), "ghostnetv2_100": (64, 2),
    "halonet26t": (256, 2),
}  # fmt: skip

_B = {
    "vocab_size": 128, "max_position_embeddings": 64, "hidden_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
_DEC = {**_B, "use_cache": False}
_S2S = {
    "vocab_size": 128, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
    "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64, "max_position_embeddings": 64, "pad_token_id": 0,
    "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1, "use_cache": False,
}  # fmt: skip
_GPTJ = {"vocab_size": 128, "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 4,
         "rotary_dim": 4, "use_cache": False}  # fmt: skip
_IMG = {"image_size": 32, "num_channels": 3, "patch_size": 8}
_INPUTS = {
    "text": "{'input_ids': torch.randint(3, 128, (2, 16))}",
    "seq2seq": "{'input_ids': torch.randint(3, 128, (2, 16)), "
    "'decoder_input_ids': torch.randint(3, 128, (2, 8))}",
    "image32": "{'pixel_values': torch.randn(2, 3, 32, 32)}",
    "image64": "{'pixel_values': torch.randn(2, 3, 64, 64)}",
}
# family -> (model_type, auto class, config, inputs)
HF = {
    "gptj": ("gptj", "AutoModelForCausalLM", _GPTJ, "text"),
    "codegen": ("codegen", "AutoModelForCausalLM", {**_GPTJ, "n_ctx": 64}, "text"),
    "gpt_neo": ("gpt_neo", "AutoModelForCausalLM", {
        "vocab_size": 128, "max_position_embeddings": 64, "hidden_size": 32, "num_layers": 2,
        "num_heads": 4, "attention_types": [[["global", "local"], 1]], "window_size": 8,
        "use_cache": False}, "text"),
    "xlnet": ("xlnet", "AutoModelForCausalLM", {
        "vocab_size": 128, "d_model": 32, "n_layer": 2, "n_head": 4, "d_inner": 64}, "text"),
    "mpnet": ("mpnet", "AutoModelForMaskedLM", _B, "text"),
    "deberta": ("deberta", "AutoModelForMaskedLM", _B, "text"),
    "mobilebert": ("mobilebert", "AutoModelForMaskedLM", {
        **_B, "embedding_size": 32, "intra_bottleneck_size": 32, "true_hidden_size": 32,
        "num_feedforward_networks": 2}, "text"),
    "rwkv": ("rwkv", "AutoModelForCausalLM", {
        "vocab_size": 128, "context_length": 64, "hidden_size": 32, "num_hidden_layers": 2,
        "attention_hidden_size": 32, "intermediate_size": 64, "use_cache": False}, "text"),
    "qwen3": ("qwen3", "AutoModelForCausalLM", {**_DEC, "num_key_value_heads": 2,
                                                "head_dim": 8}, "text"),
    "qwen2_moe": ("qwen2_moe", "AutoModelForCausalLM", {
        **_DEC, "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32}, "text"),
    "olmo": ("olmo", "AutoModelForCausalLM", _DEC, "text"),
    "starcoder2": ("starcoder2", "AutoModelForCausalLM", {**_DEC, "num_key_value_heads": 2},
                   "text"),
    "granite": ("granite", "AutoModelForCausalLM", _DEC, "text"),
    "jamba": ("jamba", "AutoModelForCausalLM", {
        **_DEC, "num_key_value_heads": 2, "num_experts": 2, "num_experts_per_tok": 1,
        "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2,
        "expert_layer_offset": 1, "mamba_d_state": 8, "mamba_dt_rank": 4,
        "use_mamba_kernels": False}, "text"),
    "falcon_mamba": ("falcon_mamba", "AutoModelForCausalLM", {
        "vocab_size": 128, "hidden_size": 32, "state_size": 8, "num_hidden_layers": 2,
        "use_cache": False}, "text"),
    "recurrent_gemma": ("recurrent_gemma", "AutoModelForCausalLM", {
        **_DEC, "num_key_value_heads": 2, "lru_width": 32, "attention_window_size": 16,
        "conv1d_width": 4, "logits_soft_cap": 30.0, "block_types": ["recurrent", "attention"],
        "head_dim": 8}, "text"),
    "pegasus": ("pegasus", "AutoModelForSeq2SeqLM", _S2S, "seq2seq"),
    "mbart": ("mbart", "AutoModelForSeq2SeqLM", _S2S, "seq2seq"),
    "marian": ("marian", "AutoModelForSeq2SeqLM", {**_S2S, "decoder_vocab_size": 128},
               "seq2seq"),
    "dinov2": ("dinov2", "AutoModel", {**_B, **_IMG}, "image32"),
    "beit": ("beit", "AutoModelForImageClassification", {**_B, **_IMG}, "image32"),
    "segformer": ("segformer", "AutoModelForSemanticSegmentation", {
        "num_channels": 3, "num_encoder_blocks": 2, "depths": [1, 1], "sr_ratios": [2, 1],
        "hidden_sizes": [16, 32], "patch_sizes": [7, 3], "strides": [4, 2],
        "num_attention_heads": [1, 2], "mlp_ratios": [2, 2], "decoder_hidden_size": 32},
        "image32"),
    "convnextv2-tiny": ("convnextv2", "AutoModelForImageClassification", {}, "image64"),
    "resnet-50": ("resnet", "AutoModelForImageClassification", {}, "image64"),
    "mobilevit-small": ("mobilevit", "AutoModelForImageClassification", {"image_size": 64},
                        "image64"),
}  # fmt: skip
RNN_MODELS = ["packed", "cell_loop", "seq2seq", "stateful", "conv_gru"]

_TIMM_FILE = """import torch
import timm


def model():
    return timm.create_model({name!r}, pretrained=False)


def example_inputs():
    return (torch.randn({batch}, 3, {size}, {size}),), {{}}
"""
_HF_FILE = """import torch
import transformers


def model():
    config = transformers.AutoConfig.for_model({model_type!r}, **{config!r})
    return getattr(transformers, {auto!r}).from_config(config)


def example_inputs():
    return (), {inputs}
"""
# the RNNs' source is the model file's own, so the rules that name a user's line see it
_RNN_ENTRY = "\n\nmodel, example_inputs = {name}, {name}_inputs\n"


def model_files(folder: str) -> dict[str, str]:
    """Name -> `file.py:model` of every model, written into `folder`."""
    out = {}
    for name, (size, batch) in TIMM.items():
        out[f"timm-{name}"] = _TIMM_FILE.format(name=name, size=size, batch=batch)
    for name, (model_type, auto, config, kind) in HF.items():
        text = _HF_FILE.format(model_type=model_type, auto=auto, config=config,
                               inputs=_INPUTS[kind])  # fmt: skip
        out[f"hf-{name}"] = text
    for name in RNN_MODELS:
        out[f"rnn-{name}"] = RNNS.read_text() + _RNN_ENTRY.format(name=name)
    sources = {}
    for name, text in out.items():
        path = Path(folder) / f"{name.replace('-', '_')}.py"
        path.write_text(text)
        sources[name] = f"{path}:model"
    return sources


def inspect(source: str, out: Path, timeout: int) -> tuple[dict[str, Any] | None, str, float]:
    """(report JSON or None, the CLI's last stderr line, wall seconds)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "inspector.cli", "inspect", source, "--json", str(out)]
    start = time.perf_counter()
    try:
        run = subprocess.run(cli, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s", time.perf_counter() - start
    wall = time.perf_counter() - start
    if run.returncode != 0 or not out.exists():
        lines = [line for line in run.stderr.strip().splitlines() if line.startswith("error")]
        return None, (lines or ["exit " + str(run.returncode)])[0][:200], wall
    return json.loads(out.read_text()), "", wall


_RED = {"nan", "cut", "unused", "vanishing", "exploding"}


def row(name: str, report: dict[str, Any] | None, failure: str, wall: float) -> str:
    if report is None:
        return f"| {name} | {wall:.1f} | failed: {failure} | | | | | | |"
    alarms = sorted(
        {f["rule"] for f in report["findings"] if f["severity"] in ("warning", "error")}
    )
    red = [x["module_path"] for x in report["gradients"]["layers"] if x["verdict"] in _RED]
    warnings = len(report["meta"]["warnings"])
    compile_ = report["compile"]
    breaks = compile_.get("graph_break_count")
    notes = len(compile_.get("notes") or [])
    targets = report["export"].get("targets") or []
    export = "ok" if targets and targets[0].get("ok") else ("failed" if targets else "-")
    measured = report["memory"].get("measured") or {}

    def err(key: str) -> str:
        value = measured.get(key)
        return "-" if value is None else f"{value:+.1%}"

    errors = " / ".join(err(k) for k in ("forward_peak_error", "saved_activation_error",
                                          "train_peak_error"))  # fmt: skip
    return (
        f"| {name} | {wall:.1f} | {', '.join(alarms) or 'none'} | {len(red)} | {warnings} "
        f"| {breaks} | {notes} | {export} | {errors} |"
    )


HEADER = (
    "| model | report s | warning/error findings | red verdicts | analysis warnings "
    "| graph breaks | Dynamo notes | export | forward peak / saved / train peak err |\n"
    "|---|---:|---|---:|---:|---:|---:|---|---|"
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="comma-separated names (timm-..., hf-..., rnn-...)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per model")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        sources = model_files(folder)
        names = args.only.split(",") if args.only else list(sources)
        print(HEADER, flush=True)
        for name in names:
            report, failure, wall = inspect(sources[name], Path(folder) / "r.json", args.timeout)
            print(row(name, report, failure, wall), flush=True)
            (Path(folder) / "r.json").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
