"""flashc registered as a transformers attention implementation, on a tiny Llama model on the
CPU in float32: logits, loss, every weight's gradient and greedy generation (with the KV
cache, so single-query decoding steps) agree with transformers' SDPA attention. Skipped
without torch and transformers; the full-size bf16 comparison is tests/gpu/test_transformers.py."""

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashc.transformers  # noqa: E402


def relative_difference(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def test_tiny_llama_matches_sdpa():
    name = flashc.transformers.register()
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=32,
                                      max_position_embeddings=128)
    torch.manual_seed(0)
    # One config object each: transformers writes the implementation into the config.
    sdpa_model = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config),
                                                            attn_implementation="sdpa")
    flashc_model = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config),
                                                              attn_implementation=name)
    flashc_model.load_state_dict(sdpa_model.state_dict())
    assert flashc_model.config._attn_implementation == name

    calls = []
    hook = flashc_model.model.layers[0].self_attn.register_forward_hook(
        lambda *_: calls.append(1))
    input_ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(1))
    sdpa_result = sdpa_model(input_ids=input_ids, labels=input_ids)
    flashc_result = flashc_model(input_ids=input_ids, labels=input_ids)
    hook.remove()
    assert calls
    assert relative_difference(flashc_result.logits, sdpa_result.logits) <= 1e-5
    assert abs(flashc_result.loss.item() - sdpa_result.loss.item()) <= 1e-5
    sdpa_result.loss.backward()
    flashc_result.loss.backward()
    for (name_, p_sdpa), p_flashc in zip(sdpa_model.named_parameters(), flashc_model.parameters()):
        assert relative_difference(p_flashc.grad, p_sdpa.grad) <= 1e-4, name_

    prompt = input_ids[:, :8]
    mask = torch.ones_like(prompt)
    generated = [model.generate(prompt, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                pad_token_id=0)
                 for model in (sdpa_model, flashc_model)]
    assert torch.equal(generated[0], generated[1])


def test_padding_masks_are_refused():
    name = flashc.transformers.register()
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=32)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation=name)
    input_ids = torch.randint(0, 64, (2, 10))
    mask = torch.ones_like(input_ids)
    mask[0, :3] = 0
    with pytest.raises(flashc.FlashcError) as info:
        model(input_ids=input_ids, attention_mask=mask)
    assert info.value.status == flashc.Status.ERROR_UNSUPPORTED
    assert "padding" in info.value.message
    with pytest.raises(ValueError):
        flashc.transformers.register("my_flash")
