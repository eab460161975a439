"""A real client: a Llama-style model from transformers (random weights from a config, no
download; 4 layers, GQA 16/4 heads of 64, seqlen 1024, bf16) run once with transformers'
SDPA attention and once with flashc registered as its attention implementation. Logits, loss
and every weight's gradient must agree within bf16 tolerance, measured against the same
model in float32: flashc's error against float32 may not exceed SDPA's by more than noise.
A few AdamW steps (float32 master weights, bf16 autocast) must track each other. Prints the
figures.

Run on a machine with a GPU, after building libflashc with the CUDA backend:
    python3 -m pytest tests/gpu/test_transformers.py -q -s
"""

import copy
import os
import sys

import pytest

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.environ.get("FLASHC_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(_REPO_ROOT, "python"))
    _gpu_build = os.path.join(os.environ.get("FLASHC_BUILD_DIR", os.path.join(_REPO_ROOT, "build-gpu")),
                              "libflashc.so")
    if "FLASHC_LIBRARY" not in os.environ and os.path.exists(_gpu_build):
        os.environ["FLASHC_LIBRARY"] = _gpu_build

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashc  # noqa: E402
import flashc.transformers  # noqa: E402

MODEL_CONFIG = dict(vocab_size=8192, hidden_size=1024, intermediate_size=2816,
                    num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                    head_dim=64, max_position_embeddings=2048, attention_dropout=0.0,
                    tie_word_embeddings=False)
BATCH, SEQLEN = 2, 1024
TRAINING_STEPS = 6

# flashc's relative error against float32 may be at most this multiple of SDPA's, plus a
# small floor for tensors that both get nearly exactly.
ERROR_RATIO, ERROR_FLOOR = 1.5, 2e-3
# Direct flashc-vs-SDPA bounds: both are bf16 computations, so they differ by about the
# bf16 error of each.
LOGITS_BOUND, LOSS_BOUND, GRADIENT_BOUND, TRAINING_LOSS_BOUND = 5e-2, 1e-2, 1e-1, 2e-2


def relative(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def build_model(config, implementation, state_dict, device, dtype):
    # One config object per model: transformers writes the implementation into it.
    model = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config),
                                                       attn_implementation=implementation)
    model.load_state_dict(state_dict)
    return model.to(device=device, dtype=dtype).train()


def loss_logits_gradients(model, input_ids):
    model.zero_grad(set_to_none=True)
    result = model(input_ids=input_ids, labels=input_ids)
    result.loss.backward()
    gradients = {name: p.grad.detach().float().clone() for name, p in model.named_parameters()}
    return result.loss.detach().float().item(), result.logits.detach().float(), gradients


def compare(device, model_config, batch, seqlen, steps, emit):
    """Runs the comparison; returns a list of failed checks (empty when all hold)."""
    name = flashc.transformers.register()
    config = transformers.LlamaConfig(**model_config)
    torch.manual_seed(0)
    initial = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config),
                                                         attn_implementation="sdpa")
    # The float32 model gets the bf16-rounded weights, so that it measures compute error only.
    state = {k: v.to(torch.bfloat16).float() for k, v in initial.state_dict().items()}
    del initial
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, config.vocab_size, (batch, seqlen), generator=generator)
    input_ids = input_ids.to(device)
    failures = []

    def check(ok, message):
        if not ok:
            failures.append(message)

    # ---- one forward and backward: bf16 SDPA, bf16 flashc, float32 SDPA -------------------
    runs = {}
    for label, implementation, dtype in (("sdpa", "sdpa", torch.bfloat16),
                                         ("flashc", name, torch.bfloat16),
                                         ("fp32", "sdpa", torch.float32)):
        model = build_model(config, implementation, state, device, dtype)
        runs[label] = loss_logits_gradients(model, input_ids)
        del model
    (loss_s, logits_s, grads_s), (loss_f, logits_f, grads_f), (loss_32, logits_32, grads_32) = (
        runs["sdpa"], runs["flashc"], runs["fp32"])

    emit("Llama %d layers, heads %d/%d x %d, hidden %d, batch %d x seqlen %d, bf16, on %s"
         % (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.head_dim, config.hidden_size, batch, seqlen, device))
    emit("loss: sdpa %.6f  flashc %.6f  float32 %.6f  |flashc - sdpa| %.2e"
         % (loss_s, loss_f, loss_32, abs(loss_f - loss_s)))
    logits_error_s, logits_error_f = relative(logits_s, logits_32), relative(logits_f, logits_32)
    logits_difference = relative(logits_f, logits_s)
    emit("logits: flashc vs sdpa %.2e; vs float32: sdpa %.2e, flashc %.2e"
         % (logits_difference, logits_error_s, logits_error_f))
    check(logits_difference <= LOGITS_BOUND, "logits differ by %.2e" % logits_difference)
    check(logits_error_f <= ERROR_RATIO * logits_error_s + ERROR_FLOOR,
          "logits: flashc error %.2e vs sdpa %.2e" % (logits_error_f, logits_error_s))
    check(abs(loss_f - loss_s) <= LOSS_BOUND * abs(loss_s),
          "loss differs by %.2e" % abs(loss_f - loss_s))

    emit("gradients (relative): flashc vs sdpa | vs float32: sdpa, flashc")
    worst_difference, worst_ratio = 0.0, 0.0
    for weight in grads_s:
        difference = relative(grads_f[weight], grads_s[weight])
        error_s = relative(grads_s[weight], grads_32[weight])
        error_f = relative(grads_f[weight], grads_32[weight])
        worst_difference = max(worst_difference, difference)
        worst_ratio = max(worst_ratio, error_f / max(error_s, 1e-12))
        if weight.startswith("model.layers.0.") or not weight.startswith("model.layers."):
            emit("  %-48s %.2e | %.2e %.2e" % (weight, difference, error_s, error_f))
        check(difference <= GRADIENT_BOUND, "%s: gradients differ by %.2e" % (weight, difference))
        check(error_f <= ERROR_RATIO * error_s + ERROR_FLOOR,
              "%s: flashc gradient error %.2e vs sdpa %.2e" % (weight, error_f, error_s))
    emit("  (layers 1.. alike) %d weights: largest flashc-vs-sdpa %.2e, largest error ratio "
         "flashc/sdpa %.2f" % (len(grads_s), worst_difference, worst_ratio))

    # ---- a few training steps: float32 master weights, bf16 autocast ---------------------
    losses = {}
    final_weights = {}
    for label, implementation in (("sdpa", "sdpa"), ("flashc", name)):
        torch.manual_seed(2)
        model = build_model(config, implementation, state, device, torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        losses[label] = []
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
                loss = model(input_ids=input_ids, labels=input_ids).loss
            loss.backward()
            optimizer.step()
            losses[label].append(loss.item())
        final_weights[label] = torch.cat([p.detach().flatten() for p in model.parameters()])
        del model, optimizer
    emit("training (AdamW lr 1e-3, same batch): step, loss sdpa, loss flashc, relative difference")
    for step, (a, b) in enumerate(zip(losses["sdpa"], losses["flashc"])):
        emit("  %d  %.5f  %.5f  %.1e" % (step, a, b, abs(a - b) / abs(a)))
        check(abs(a - b) <= TRAINING_LOSS_BOUND * abs(a),
              "training step %d: losses %.5f and %.5f" % (step, a, b))
    for label in losses:
        check(losses[label][-1] < losses[label][0], "%s: loss did not decrease" % label)
    emit("  weights after training: flashc vs sdpa relative difference %.2e"
         % relative(final_weights["flashc"], final_weights["sdpa"]))
    return failures


@pytest.mark.skipif(not torch.cuda.is_available() or "cuda" not in flashc.backends(),
                    reason="needs a CUDA device and libflashc built with the CUDA backend")
def test_llama_with_flashc_matches_sdpa(capsys):
    lines = []
    failures = compare("cuda", MODEL_CONFIG, BATCH, SEQLEN, TRAINING_STEPS, lines.append)
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert not failures, "\n".join(failures)
